"""A job three times longer than its queue lets a message stay hidden, rolled over.

    .venv/bin/python examples/long_job.py

The in-memory queue here caps a message's invisibility at 4 s after each receive
(as SQS does at 12 hours). The one job takes 12 s: 24 steps of half a second,
each saved with ``held.checkpoint(...)``. With ``on_cap="rollover"`` the handler
is told to roll over (``held.rolling``, and ``held.check()`` raising
``Rollover``) two extend thresholds (0.8 s) before the cap - here after 3.5 s of
work, seven steps - and leasekeeper sends a continuation carrying the last
checkpoint, then deletes the original; whichever worker receives the
continuation resumes there. So the job finishes in four hops (three rollovers).
Two workers share the queue, and the job is never in two hands at once. It prints
each hop and, at the end, the counts.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time

import leasekeeper
from leasekeeper import MemoryQueue, Message, Worker

# The timings scale together: LONG_JOB_SCALE=0.5 runs it twice as fast (the tests).
SCALE = float(os.environ.get("LONG_JOB_SCALE", "1"))
CAP = 4.0 * SCALE  # the queue's cap on one message's invisibility
VISIBILITY = 1.0 * SCALE
STEP = 0.5 * SCALE
STEPS = 24  # 12 s of work at scale 1: three caps

holding = threading.Semaphore(1)  # taken while a hop runs: never two at once
overlaps: list[str] = []  # hops that found another one running: never any


def handle(message: Message, worker: str) -> None:
    held = leasekeeper.current_lease()
    done = held.resumed or 0  # the last checkpoint; None on the original
    first_id, hop = held.lineage
    print(f"hop {hop} of job {first_id} on worker {worker}: from step {done}", flush=True)
    alone = holding.acquire(blocking=False)
    if not alone:
        overlaps.append(f"hop {hop}")
    try:
        while done < STEPS:
            held.check()  # LeaseLost: stop; Rollover: hand the job on
            time.sleep(STEP)  # one step of the real work
            done += 1
            held.checkpoint(done)  # where the next hop resumes; also progress
    finally:
        if alone:
            holding.release()
    print(f"job {first_id} done after {hop} rollover(s)", flush=True)


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    queue = MemoryQueue(VISIBILITY, max_lease_age=CAP)
    queue.send("render the report")
    workers = [
        Worker(
            queue,
            functools.partial(handle, worker=name),
            concurrency=1,
            wait_seconds=0.1,
            on_cap="rollover",
            visibility_timeout=VISIBILITY,
            timer_interval=0.1 * SCALE,
            minimal_life=0.3 * SCALE,
        )
        for name in "AB"
    ]
    runs = [threading.Thread(target=w.run, kwargs={"until_idle": SCALE}) for w in workers]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    completed = sum(w.stats.completed for w in workers)
    rolled = sum(w.manager.stats().rolled_over for w in workers)
    lost = sum(w.stats.lost for w in workers)
    print(
        f"completed {completed}, rolled over {rolled}, lost {lost}, "
        f"overlapping hops {len(overlaps)}"
    )
    print(f"left on the queue: {len(queue)}")


if __name__ == "__main__":
    main()

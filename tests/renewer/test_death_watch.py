"""The renewer's watch on its worker raises once, and never after it is settled.

A worker killed at once closes the socket (end of file, seen by a serving thread)
and, on Linux, sends the parent-death signal, and the watchdog signals too when
``getppid()`` changes. Whichever the renewer sees first, a later notice must not
interrupt the release that follows: CI once saw none of 20 messages come back
because the watchdog's signal cut the release short and the second ``close()`` did
nothing. Run in a subprocess: the watch installs a signal handler and
``PR_SET_PDEATHSIG`` on the process it runs in.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from typing import Any

SCRIPT = textwrap.dedent(
    """
    import os, signal
    from leasekeeper.renewers._death import PARENT_DEATH_SIGNAL, DeathWatch, WorkerGone

    def notice(watch):
        try:
            os.kill(os.getpid(), PARENT_DEATH_SIGNAL)  # handled before kill() returns
        except WorkerGone:
            return "raised"
        return "quiet"

    alive = DeathWatch(os.getppid())
    alive.start()
    print("parent alive:", notice(alive))

    dead = DeathWatch(os.getppid())
    signal.signal(PARENT_DEATH_SIGNAL, dead.on_notice)
    dead.parent = -1  # as if the worker died and we were re-parented
    print("first notice:", notice(dead), "second notice:", notice(dead))

    settled = DeathWatch(os.getppid())
    signal.signal(PARENT_DEATH_SIGNAL, settled.on_notice)
    settled.settle()
    settled.parent = -1
    print("after settle:", notice(settled))

    building = DeathWatch(os.getppid())  # while the renewer builds its backend
    signal.signal(PARENT_DEATH_SIGNAL, building.on_notice)
    building.defer()
    building.parent = -1
    print("deferred:", notice(building), "resumed:", building.resume(), notice(building))
    """
)


def test_the_watch_raises_once_and_never_after_it_is_settled() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "parent alive: quiet",  # a signal from a worker thread's exit is not a death
        "first notice: raised second notice: quiet",
        "after settle: quiet",
        # kept, not raised, while deferred; told by resume(), which settles the watch
        "deferred: quiet resumed: True quiet",
    ]


WATCHED = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from leasekeeper.renewers._death import PARENT_DEATH_SIGNAL, DeathWatch, WorkerGone

    # Only the watchdog: no PR_SET_PDEATHSIG, no socket (as when a forked copy of the
    # worker keeps the socket open).
    watch = DeathWatch(os.getppid())
    signal.signal(PARENT_DEATH_SIGNAL, watch.on_notice)
    threading.Thread(target=watch._watchdog, daemon=True).start()
    out = open(sys.argv[1], "a")
    out.write("watching\\n"); out.flush()
    try:
        time.sleep(30)
        out.write("never told\\n")
    except WorkerGone:
        out.write(f"gone {time.monotonic():.3f}\\n")
    """
)

WORKER = textwrap.dedent(
    """
    import subprocess, sys, time
    log = sys.argv[1]
    subprocess.Popen([sys.executable, "-c", sys.argv[2], log])
    while "watching" not in open(log).read():
        time.sleep(0.01)
    print(f"{time.monotonic():.3f}")  # and exits
    """
)


def test_the_watchdog_tells_the_worker_s_exit_at_once(tmp_path: Any) -> None:
    log = tmp_path / "watch.log"
    log.write_text("")
    worker = subprocess.run(
        [sys.executable, "-c", WORKER, str(log), WATCHED],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    exited = float(worker.stdout.strip())
    deadline = time.monotonic() + 10
    while "gone" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    lines = log.read_text().splitlines()
    assert lines[0] == "watching"
    assert lines[1].startswith("gone"), lines
    assert float(lines[1].split()[1]) - exited < 2.0

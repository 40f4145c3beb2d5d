"""``read_stream``'s receivers: keep receiving and leasing ahead while Spark runs batches.

Spark asks the reader for the next micro-batch (``latestOffset``) only after it
has planned, run and committed the one before, a few tenths of a second to
many seconds. A reader that receives only when asked leaves the queue idle all
that time. A ``Prefetcher`` instead receives on a thread of its own into a
buffer of up to ``ahead`` messages, and ``take`` hands the next batch out of the
buffer, usually at once.

What it keeps of the at-least-once contract: every buffered message is leased
(registered with the reader's LeaseManager the moment its receive returns, so
renewed like any other) and is in no batch yet, so nothing is deleted before
the sink has committed it; ``stop`` waits for the receives under way and the
reader then releases everything, the buffer included.

Receiving: one long poll of ``poll_seconds`` while the queue is empty; rounds
of up to ``receive_concurrency`` receives at a time (no wait) while they keep
bringing messages; never more than the buffer has room for. A receive that
fails transiently is retried after 0.5, 1, 2, 4, then every 8 s; a fatal one
(the queue is gone, the credentials are refused) stops the receiving and fails
the query at its next ``take``. So does a queue that no receive has reached
within ``REACH_WITHIN`` (20 s) of the receiving's start, with the last transient
failure (which names the endpoint): a typo in a URL or an emulator not started
fails the query rather than leaving it waiting for ever; once a receive has had
an answer, an outage is waited out (docs/guide.md, "When a service cannot be
reached"). Under ``Trigger.AvailableNow`` a round that
brings nothing sent before the run began (or nothing at all) ends the
receiving: later messages are the next run's.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from leasekeeper.backends.contract import Backend
from leasekeeper.clock import SYSTEM_CLOCK, Clock
from leasekeeper.errors import LeaseTooShort, ReceiveError
from leasekeeper.lease import Lease, LeaseState
from leasekeeper.manager import LeaseManager
from leasekeeper.receiving import REACH_WITHIN
from leasekeeper.spark.stream_options import StreamOptions
from leasekeeper.spark.stream_rows import sent_at

log = logging.getLogger("leasekeeper.spark.stream")

# A receive that fails transiently is retried after 0.5, 1, 2, 4, then every 8 s.
FIRST_PAUSE = 0.5
RECEIVE_RETRY_LIMIT = 8.0
# How long take() waits for a first message while receives keep failing
# (0.5 + 1 + 2 + 4 + 8 s) before it gives Spark no batch: a failing receive is
# not an empty queue, and the receiving goes on behind it.
FAILING_WAIT = 15.5
# With poll_seconds under this, an empty receive is followed by a pause this long
# (or until a batch is asked for): no busy polling of an empty queue.
IDLE_PAUSE = 0.2

#: Adds to one of the reader's counts (``received``, ``too_short``, ``dropped``).
Tally = Callable[[str, int], None]


class Prefetcher:
    """The receiving thread and its buffer of leased messages; see the module docstring."""

    def __init__(
        self,
        backend: Backend,
        manager: LeaseManager,
        options: StreamOptions,
        tally: Tally,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.backend = backend
        self.clock = clock  # measures REACH_WITHIN; the pauses are real time
        self.manager = manager
        self.options = options
        self.ahead = options.lease_ahead
        self._tally = tally
        self._per_call = max(1, int(getattr(backend, "max_receive", 10)))
        # Guards everything below. Never taken on the main thread outside stop():
        # a SIGTERM handler there may need it.
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._ready: list[Lease] = []  # leased, in no batch yet
        self._demand = 0  # what a take() under way asks for (room beyond `ahead`)
        self._receiving = 0  # receive calls under way
        self._empty_at = -math.inf  # when the last round that found nothing ended
        self._failing = False  # the last round's receives all failed
        self._failure: ReceiveError | None = None  # fatal: the query fails at take()
        self._started_at = 0.0  # on self.clock, when the receiving started
        self._reached = False  # a receive has had an answer (messages or none)
        self._last_error: ReceiveError | None = None  # the last transient failure
        self._cutoff: float | None = None  # Trigger.AvailableNow: the run's start
        self._exhausted = False
        self._stopping = False
        self._pool = ThreadPoolExecutor(
            options.receive_concurrency, thread_name_prefix="leasekeeper-stream-receive"
        )
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the reader's side

    def available_now(self, cutoff: float) -> None:
        """Trigger.AvailableNow: messages sent after ``cutoff`` (epoch seconds) end the run."""
        with self._lock:
            self._cutoff = cutoff
            self._exhausted = False
            self._changed.notify_all()

    @property
    def exhausted(self) -> bool:
        """Under Trigger.AvailableNow: the receiving has ended and the buffer is empty."""
        with self._lock:
            return self._exhausted and not self._ready

    def take(self, want: int) -> list[Lease]:
        """The next batch: up to ``want`` leased messages from the buffer, at once if it
        holds that many; else waiting while receives keep bringing more, for at most
        ``fill_seconds`` once there is one (a first one is waited for one long poll,
        or while receives fail, ``FAILING_WAIT``), or until a receive finds the
        queue empty. Leases lost while buffered are left out (their messages come
        back). Raises the ReceiveError that stopped the receiving."""
        self._start()
        begun = time.monotonic()
        options = self.options
        with self._changed:
            self._demand = want
            self._changed.notify_all()
            try:
                while True:
                    self._drop_lost()
                    if self._failure is not None:
                        raise self._failure
                    have = len(self._ready)
                    if have >= want or self._stopping or self._exhausted:
                        break
                    if self._empty_at >= begun:  # a receive found nothing since we began
                        break
                    now = time.monotonic()
                    if have:
                        limit = begun + options.fill_seconds
                    elif self._failing:
                        limit = begun + max(options.poll_seconds, FAILING_WAIT)
                    else:  # one long poll, and the round that carries it back
                        limit = begun + options.poll_seconds + options.fill_seconds
                    if now >= limit:
                        break
                    self._changed.wait(limit - now)
                taken, self._ready = self._ready[:want], self._ready[want:]
            finally:
                self._demand = 0
            self._changed.notify_all()  # room again
        return taken

    def stop(self, timeout: float) -> bool:
        """Receive no more; wait up to ``timeout`` for the receives under way (their
        messages get leased, so the reader's release covers them). False if some
        were still under way at the deadline."""
        deadline = time.monotonic() + timeout
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
            while self._receiving:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def shutdown(self) -> None:
        """Let the threads go (after ``stop``)."""
        self._pool.shutdown(wait=False)

    # ------------------------------------------------------------------ the receiving thread

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stopping:
                return
            self._started_at = self.clock.now()
            self._thread = threading.Thread(
                target=self._run, name="leasekeeper-stream-prefetch", daemon=True
            )
        self._thread.start()

    def _room(self) -> int:
        return max(self.ahead, self._demand) - len(self._ready)

    def _drop_lost(self) -> None:
        # A lease lost while buffered gives no row: its message comes back and is read
        # again. (Lock held.)
        kept = [lease for lease in self._ready if lease.state is LeaseState.ACTIVE]
        if len(kept) < len(self._ready):
            self._tally("dropped", len(self._ready) - len(kept))
            log.warning(
                "%d buffered lease(s) were lost before a batch took them: their messages "
                "come back and are read again",
                len(self._ready) - len(kept),
            )
            self._ready = kept

    def _run(self) -> None:
        empty = True  # the queue is taken for empty until a receive says otherwise
        pause = FIRST_PAUSE
        try:
            while True:
                with self._changed:
                    while not self._done() and self._room() <= 0:
                        self._changed.wait()
                    if self._done():
                        return
                    room = self._room()
                got, failed = self._round(room, empty)
                with self._changed:
                    self._ready += got
                    self._failing = failed and not got
                    if not got and not failed:
                        self._empty_at = time.monotonic()
                    if failed and not self._reached:
                        self._failure = self._never_reached()
                    cutoff = self._cutoff
                    if cutoff is not None and (got or not failed):
                        # AvailableNow: a round of only later messages (or of none) ends it.
                        self._exhausted = not _any_sent_before(got, cutoff)
                    self._changed.notify_all()
                empty = not got
                if empty and not failed and self.options.poll_seconds < IDLE_PAUSE:
                    # No long poll to wait in: pause rather than spin on an empty
                    # queue; a take() (or stop) wakes the receiving at once.
                    with self._changed:
                        self._changed.wait(IDLE_PAUSE)
                if failed and not got:
                    with self._changed:  # back off, unless stopping
                        self._changed.wait_for(lambda: self._stopping, self._pause(pause))
                    pause = min(pause * 2, RECEIVE_RETRY_LIMIT)
                else:
                    pause = FIRST_PAUSE
        except ReceiveError as exc:  # fatal: the queue is gone, the credentials refused
            with self._changed:
                self._failure = exc
                self._changed.notify_all()
        except Exception as exc:  # a bug: the query must not wait forever for batches
            log.exception("the stream reader's receiving stopped")
            with self._changed:
                self._failure = ReceiveError("fatal", f"{type(exc).__name__}: receiving stopped")
                self._changed.notify_all()

    def _never_reached(self) -> ReceiveError | None:
        """The last transient failure, once ``REACH_WITHIN`` has passed since the
        receiving started with no receive answered; else None. (Lock held.)"""
        if self.clock.now() - self._started_at < REACH_WITHIN or self._last_error is None:
            return None
        log.error(
            "no answer from the queue in %gs since the stream reader started, failing "
            "the query: %s",
            REACH_WITHIN,
            self._last_error,
        )
        return self._last_error

    def _pause(self, pause: float) -> float:
        """The back-off after a failed round: ``pause``, or less where the queue was
        never reached and ``REACH_WITHIN`` ends sooner (one more try then). (Lock held.)"""
        if self._reached:
            return pause
        return max(0.0, min(pause, self._started_at + REACH_WITHIN - self.clock.now()))

    def _done(self) -> bool:
        return self._stopping or self._exhausted or self._failure is not None

    def _round(self, room: int, empty: bool) -> tuple[list[Lease], bool]:
        """One long poll when the queue looked empty, else up to receive_concurrency
        receives at once. Returns the leases and whether any receive failed."""
        if empty:
            sizes = [min(self._per_call, room)]
            wait = self.options.poll_seconds
        else:
            calls = min(self.options.receive_concurrency, math.ceil(room / self._per_call))
            sizes = [min(self._per_call, room - i * self._per_call) for i in range(calls)]
            wait = 0.0
        if len(sizes) == 1:
            pages = [self._receive(sizes[0], wait)]
        else:
            futures = [self._pool.submit(self._receive, size, wait) for size in sizes]
            pages = [future.result() for future in futures]
        got = [lease for page in pages if page is not None for lease in page]
        return got, None in pages

    def _receive(self, count: int, wait: float) -> list[Lease] | None:
        """One receive, its messages leased; None when it failed transiently."""
        with self._lock:
            if self._stopping:
                return []
            self._receiving += 1
        try:
            try:
                messages = self.backend.receive(
                    max_messages=count,
                    wait_seconds=wait,
                    visibility_timeout=self.options.config.visibility_timeout,
                )
            except ReceiveError as exc:
                if not exc.retryable:
                    raise
                log.warning("a receive failed (%s)", exc)
                with self._lock:
                    self._last_error = exc
                return None
            with self._lock:
                self._reached = True
            leases: list[Lease] = []
            short = 0
            for message in messages:
                try:
                    leases.append(self.manager.register(message))
                except LeaseTooShort as exc:
                    short += 1
                    log.warning("%s; it is left to reappear", exc)
            self._tally("received", len(leases))
            self._tally("too_short", short)
            return leases
        finally:
            with self._changed:
                self._receiving -= 1
                self._changed.notify_all()


def _any_sent_before(leases: list[Lease], cutoff: float) -> bool:
    """Whether a lease's message was sent by ``cutoff`` (one with no sent time counts)."""
    for lease in leases:
        sent = sent_at(lease.message)
        if sent is None or sent.timestamp() <= cutoff:
            return True
    return False

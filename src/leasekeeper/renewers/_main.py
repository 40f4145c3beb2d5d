"""The renewer process: ``python -m leasekeeper.renewers._main FD BELL``.

Started by ``renewers.process.ProcessRenewer`` with one end of a socket pair as file
descriptor FD, and the read end of the pipe the worker rings it by as BELL. It
says it has started, then builds its own backend from the worker's
``backend.spec()`` (importing the service's SDK is most of its start-up; the
worker's constructor waits for it), runs an ordinary thread-mode
``LeaseManager`` on it, says it serves (or why it could not build), and does what
the worker asks (``_frames`` lists the frames): lease, complete, release, report.
Because it is a process of its own, a worker holding the GIL in a C call does not stop its
renewals, and a worker that dies is noticed at once. A renewer started in the place of
one that died is first handed that one's leases (``Adopt``: ``renewers._succession``).

The worker's death is noticed three ways, whichever comes first: end of file on the
socket (the kernel closes a dead process's sockets); the parent-death signal (Linux
``PR_SET_PDEATHSIG``, which fires when the *thread* that started us exits, so it is
only believed once ``getppid()`` changed too); and the worker's exit itself, seen by
a watchdog thread, for a socket kept open by a forked copy of the worker (it waits
on a pidfd where Linux has them: an idle renewer never wakes; else it checks
``getppid()`` every ``WATCH_INTERVAL``). Then every lease still held is released
(visibility 0), so another worker gets its message at once, and the process exits:
no renewer outlives its worker. It never infers death from silence: a worker stuck
in C code says nothing and is alive. SIGINT and SIGTERM are ignored: the renewer
shares its worker's fate, not its terminal's or its service manager's, and it must
keep renewing while a worker's graceful shutdown lets its handlers finish.

Requests are read and done by a pool of serving threads, leader/follower: the
thread that reads a request does it, so the worker's round trip crosses no extra
thread here. The leader reads when the worker rings (a request, or what must be
held soon), else a while after frames came, with those that came meanwhile
(``_bell``). It reads every frame already waiting at once (the worker writes
several in one ``Batch``): the completes among them are done in one call and
answered in one write. Notices go out through their own sender thread (``_outbox``), so a
worker that is not reading (stuck in C code) never stalls the renewals here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from leasekeeper.backends.contract import Backend, Message
from leasekeeper.config import LeaseConfig
from leasekeeper.engine.stats import Stats
from leasekeeper.errors import LeaseError
from leasekeeper.lease import Lease
from leasekeeper.manager import LeaseManager
from leasekeeper.reasons import LostReason
from leasekeeper.record import LeaseState
from leasekeeper.renewers._bell import Doorbell
from leasekeeper.renewers._channel import Channel
from leasekeeper.renewers._death import DeathWatch, WorkerGone
from leasekeeper.renewers._frames import (
    Abandon,
    Add,
    Adds,
    Adopt,
    Adopted,
    AskStats,
    Batch,
    Close,
    Complete,
    Done,
    Drop,
    Ended,
    Failed,
    Forget,
    FrameReader,
    Hello,
    Observe,
    Progress,
    Release,
    Serving,
    Started,
    encode_error,
    recv_frame,
    send_frame,
)
from leasekeeper.renewers._held import HeldLeases
from leasekeeper.renewers._outbox import Forwarder, Outbox
from leasekeeper.renewers.thread import ThreadRenewer

log = logging.getLogger("leasekeeper.renewer")

EXIT_RELEASE_TIMEOUT = 10.0  # how long releasing at the worker's death may take


class ChildRenewer:
    """A thread-mode LeaseManager on the rebuilt backend, driven by the worker's frames."""

    def __init__(
        self,
        conn: Channel,
        doorbell: Doorbell,
        manager: LeaseManager,
        outbox: Outbox,
        more_queues: Sequence[Backend] = (),
    ) -> None:
        self._conn = conn
        self._doorbell = doorbell
        self._reader = FrameReader(conn)
        self._manager = manager
        self._outbox = outbox
        # The queues an add names by index: the manager's, then a multi-queue worker's.
        self._queues: list[Backend] = [*manager.queues, *more_queues]
        self._leases: dict[int, Lease] = {}  # the worker's key -> lease
        self._keys: dict[int, int] = {}  # id(lease) -> key (the forwarder forgets ended ones)
        self._forwarder = Forwarder(outbox, self._leases, self._keys, self._queues)
        manager.add_observer(self._forwarder)
        renewer = manager.renewer
        if not isinstance(renewer, ThreadRenewer):
            raise TypeError("the renewer process runs a thread-mode manager")
        # Leases held back until their first renewal nears: most jobs end before,
        # and then their lease costs only its share of a batch delete.
        self._held = HeldLeases(renewer, self._refused, self._read_before_adopting)
        self._renewer = renewer
        # Adds read with their Drop (the job ended before its Add was read): never
        # held; kept a while, as dropped leases are, for a Complete that may come.
        self._dropped_on_arrival: set[int] = set()  # the keys the Drops being done name
        # Registered leases the engine did not count (never held), less the ones it
        # counted twice (a Complete brought one back to be held anew).
        self._uncounted = 0
        # Leader/follower: whichever serving thread holds this lock waits for the next
        # frames, reads them, lets go, and does the request itself - no handoff to
        # another thread on the worker's round trip.
        self._read_lock = threading.Lock()
        # Guards the reader and the order frames are done in: the frames read are
        # done in order (the cheap ones, add, drop, abandon ...) before it is let go,
        # so a complete never overtakes the add of its lease, and the promoter of the
        # held leases can read what came before it adopts one (``_read_before_adopting``).
        # (Reentrant: a Close, and a dead worker's last frames, are done holding it.)
        self._frames_lock = threading.RLock()
        self._done = threading.Event()  # closed, or the worker is gone
        self._gone = False  # the worker is gone (not closed): release everything
        self._busy_lock = threading.Lock()  # guards _busy
        self._busy = 0  # requests being done now
        # What the worker's frames do. Cheap ones are done by the reading thread
        # before it lets go, so a complete can never overtake the add of its lease;
        # the others after it let go, while another thread reads on.
        self._cheap: dict[type, Callable[[Any], None]] = {
            Add: self._add,
            Adds: self._adds,
            Adopt: self._adopt,
            Drop: self._drop,
            Progress: self._progress,
            Abandon: self._abandon,
            AskStats: self._stats,
            Observe: self._observe,
            Close: self._close,
        }
        self._slow: dict[type, Callable[[Any], None]] = {
            Complete: self._complete,
            Release: self._release,
            Forget: self._forget,
        }
        self._threads = [
            threading.Thread(
                target=self._serve_frames, name=f"leasekeeper-renewer-op-{n}", daemon=True
            )
            for n in range(manager.config.max_concurrency)
        ]

    def serve(self, watch: DeathWatch, *, gone: bool = False) -> None:
        """Do what the worker asks until it closes us or dies (then release all).
        ``gone``: the worker's death is known already (no serving threads start)."""
        if gone:
            self._gone = True
            self._done.set()
        while True:
            try:
                if not self._gone:
                    self._start_threads()
                    self._done.wait()
                # From here on no notice of the worker's death may interrupt what
                # follows (a release cut short by one would never be redone).
                watch.settle()
                break
            except WorkerGone:  # the parent-death signal or the watchdog, here
                # The watch raised once and is settled: the next round cannot be
                # interrupted.
                self._gone = True
                self._done.set()
        if self._gone:
            self._drain()  # what the worker sent before it died, still unread
            self._wait_idle(EXIT_RELEASE_TIMEOUT)  # what the worker asked before it died
            log.info("the worker is gone: releasing %d lease(s)", len(self._leases))
            self._held.adopt_all()  # released with the others, in the same batches
            self._manager.close(release=True, timeout=EXIT_RELEASE_TIMEOUT)

    def _start_threads(self) -> None:
        for thread in self._threads:
            if thread.ident is None:
                thread.start()

    def _serve_frames(self) -> None:
        while not self._done.is_set():
            with self._read_lock:
                # The leader reads on while only cheap frames come: letting go of the
                # lock would wake a follower for nothing (a context switch a frame).
                slow: list[tuple[Any, ...]] = []
                while not slow:
                    if self._done.is_set():
                        return
                    try:
                        self._doorbell.wait()
                        with self._frames_lock:
                            slow = self._do_cheap(self._read_waiting())
                    except (EOFError, OSError):
                        self._gone = True
                        self._done.set()
                        return
            self._do_busy(slow)

    def _do_busy(self, slow: list[tuple[Any, ...]]) -> None:
        """``_do_slow``, counted as running (close waits for what runs)."""
        if not slow:
            return
        with self._busy_lock:
            self._busy += 1
        try:
            self._do_slow(slow)
        finally:
            with self._busy_lock:
                self._busy -= 1

    def _read_waiting(self) -> list[tuple[Any, ...]]:
        """The frames that have arrived (``Batch``es opened), without waiting: the
        completes among them are done in one call and answered in one write."""
        return _opened(self._reader.read_waiting())

    def _read_before_adopting(self) -> Callable[[], None]:
        """Do the cheap frames the worker wrote so far (its ``Drop``s among them):
        called by the promoter once a held lease's time to be adopted came and before
        it adopts. Returns the requests read, to be done after."""
        slow: list[tuple[Any, ...]] = []
        with self._frames_lock:
            try:
                while frames := self._read_waiting():
                    slow += self._do_cheap(frames)
            except (EOFError, OSError):
                pass  # the worker is gone: the serving threads see it too
        return lambda: self._do_busy(slow)

    def _do_cheap(self, frames: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Do the cheap frames, in order, by the reading thread; return the slow ones.
        (The slow ones before a Close are done first: it waits for what runs.)"""
        slow: list[tuple[Any, ...]] = []
        self._dropped_on_arrival = {k for f in frames if type(f) is Drop for k in f.keys}
        for frame in frames:
            if type(frame) in self._slow:
                slow.append(frame)
                continue
            if isinstance(frame, Close) and slow:
                self._do_slow(slow)
                slow = []
            self._handle(frame)
        return slow

    def _do_slow(self, frames: list[tuple[Any, ...]]) -> None:
        """The requests read together: every complete in one, then the others."""
        completes = [frame for frame in frames if isinstance(frame, Complete)]
        if completes:
            self._try(self._complete, completes)
        for frame in frames:
            if not isinstance(frame, Complete):
                self._try(self._slow[type(frame)], frame)

    def _try(self, handler: Callable[[Any], None], arg: Any) -> None:
        try:
            handler(arg)
        except Exception:
            log.exception("the worker's request failed")

    def _drain(self) -> None:
        """Do the frames a dead worker sent that nobody read yet (its last adds and
        completes: a complete it asked for is a delete, not a release). The serving
        threads stop reading once ``_done`` is set; one may still sit in a read, with
        the lock, when no end of file comes (a forked copy of the worker holds the
        socket): then there is nothing to drain."""
        if not self._frames_lock.acquire(timeout=1.0):
            return
        try:
            while True:
                waiting = self._reader.read_waiting()
                if not waiting:
                    break
                frames = [f for f in _opened(waiting) if not isinstance(f, Close)]
                self._do_slow(self._do_cheap(frames))
        except (EOFError, OSError):
            pass
        finally:
            self._frames_lock.release()

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._busy_lock:
                if self._busy == 0:
                    return
            time.sleep(0.01)

    def _handle(self, frame: tuple[Any, ...]) -> None:
        """A cheap frame, done by the reading thread before it lets go."""
        handler = self._cheap.get(type(frame))
        if handler is None:
            log.error("unknown frame %s from the worker", type(frame).__name__)
        else:
            handler(frame)

    def _progress(self, frame: Progress) -> None:
        for key, at in frame.entries:
            lease = self._leases.get(key)
            if lease is not None and at > lease.last_progress():
                lease.progressed_at = at  # the worker's monotonic clock is ours

    def _abandon(self, frame: Abandon) -> None:
        self._held.adopt((frame.key,))
        lease = self._leases.get(frame.key)
        if lease is not None:
            lease.owner.abandon(lease, frame.reason)

    def _stats(self, frame: AskStats) -> None:
        self._outbox.reply(Done(frame.request, self._counts()))

    def _counts(self) -> Stats:
        """The manager's figures, with the leases it never held counted registered."""
        stats = self._manager.stats()
        return dataclasses.replace(stats, registered=stats.registered + self._uncounted)

    def _observe(self, frame: Observe) -> None:
        self._forwarder.events = bool(frame.on)

    def _close(self, frame: Close) -> None:
        # Holding the read lock, nothing new starts; then what runs finishes, the
        # manager closes (its releases told to the worker), and only then the
        # reply: the worker's close() returns with every lease's end applied.
        self._wait_idle(EXIT_RELEASE_TIMEOUT)
        self._held.adopt_all()
        self._manager.close(release=frame.release, timeout=frame.timeout)
        self._outbox.flush()
        # The final counts ride on the reply: stats() after close() is asked here.
        self._outbox.reply(Done(frame.request, self._counts()))
        self._done.set()

    def _add(self, frame: Add) -> None:
        self._adds(Adds([frame]))

    def _adds(self, frame: Adds) -> None:
        dropped = self._dropped_on_arrival
        for entry in frame.entries:  # (key, ..., own): an Add's fields
            if entry[-1] and entry[0] in dropped:
                self._uncounted += 1  # the worker deletes it: nothing to hold
            else:
                self._start(Add._make(entry))

    def _start(self, frame: Add) -> Lease | None:
        """Hold or register the lease ``frame`` names; None when it cannot be."""
        message = _message_of(frame, self._queues)
        if not frame.watch:
            held = self._held.hold(frame.key, frame.queue, message, frame.own)
            if held is not None:
                self._leases[frame.key] = held
                self._keys[id(held)] = frame.key
                return held
        try:
            lease = (self._manager.watch if frame.watch else self._manager.register)(message)
        except LeaseError as exc:
            self._outbox.put(_lost(frame.key, exc))
            return None
        self._leases[frame.key] = lease
        self._keys[id(lease)] = frame.key
        return lease

    def _adopt(self, frame: Adopt) -> None:
        """The leases of a renewer process that died, which this one replaces
        (``_taken_over``). Counted registered there, not again here."""
        for entry in frame.leases:
            adopted = Adopted._make(entry)
            key = adopted.add[0]
            try:
                lease, held = _taken_over(adopted, self._queues, self._held, self._renewer)
            except LeaseError as exc:  # closed meanwhile
                self._outbox.put(_lost(key, exc))
                continue
            self._uncounted -= held  # hold() counted it registered: the dead renewer had
            self._leases[key] = lease
            self._keys[id(lease)] = key

    def _drop(self, frame: Drop) -> None:
        """The worker deletes these held leases' messages itself: forget them here."""
        for key, lease in self._held.drop(frame.keys):
            self._leases.pop(key, None)
            self._keys.pop(id(lease), None)

    def _forget(self, frame: Forget) -> None:
        """Stop renewing one lease; answered once no extend of it is in flight (it
        waits until the lease is free), off the reading thread so others go on."""
        self._held.adopt((frame.key,))
        lease = self._leases.get(frame.key)
        if lease is not None:
            lease.forget()
        self._outbox.reply(Done(frame.request, None))

    def _find(self, keys: Sequence[int]) -> list[Lease | None]:
        return [self._leases.get(key) for key in keys]

    def _complete(self, frames: list[Complete]) -> None:
        """The completes read together (several handlers'), done in one call and
        answered in one write (a ``Batch`` of their replies)."""
        keys = [key for frame in frames for key in frame.keys]
        again = [entry for frame in frames for entry in frame.adds]
        if again:  # dropped, but the worker could not delete them: held anew
            with self._frames_lock:
                for entry in again:
                    if entry[0] not in self._leases and self._start(Add._make(entry)) is not None:
                        self._uncounted -= 1
        # The leases still held (never renewed: each has the receipt it came with,
        # dropped ones too) are deleted as they are; the others the way complete_many goes.
        taken = self._held.take(keys)
        leases = [taken.get(key) or self._leases.get(key) for key in keys]
        outcome: dict[int, BaseException | None] = {}
        if taken:
            held = list(taken.values())
            outcome.update(zip(map(id, held), self._renewer.complete_held(held), strict=True))
        known = [lease for lease in leases if lease is not None and id(lease) not in outcome]
        if len(known) == 1 == len(leases):
            try:
                known[0].complete()
                outcome[id(known[0])] = None
            except (LeaseError, ValueError) as exc:
                outcome[id(known[0])] = exc
        elif known:
            outcome.update(zip(map(id, known), self._manager.complete_many(known), strict=True))
        results = [_unknown() if lease is None else outcome[id(lease)] for lease in leases]
        # Each lease's final extension count rides on the reply: the notices of its
        # last extends may still be queued behind it (or unread by a worker that was
        # holding its GIL), and a completed lease's count should be right at once.
        answers = [
            (encode_error(result), 0 if lease is None else lease.extensions)
            for result, lease in zip(results, leases, strict=True)
        ]
        replies: list[tuple[Any, ...]] = []
        for frame in frames:
            replies.append(Done(frame.request, answers[: len(frame.keys)]))
            del answers[: len(frame.keys)]
        self._outbox.reply(replies[0] if len(replies) == 1 else Batch(replies))

    def _release(self, frame: Release) -> None:
        delay, stop = frame.delay, frame.stop_handler
        self._held.adopt(frame.keys)
        results: list[BaseException | None] = []
        for lease in self._find(frame.keys):
            if lease is None:
                results.append(None)  # ended already here: nothing to release
                continue
            try:
                if stop:
                    self._manager.revoke(lease, 0.0 if delay is None else delay)
                else:
                    lease.release(delay)
                results.append(None)
            except (LeaseError, ValueError) as exc:
                results.append(exc)
        self._outbox.reply(Done(frame.request, [encode_error(r) for r in results]))

    def _refused(self, key: int, lease: Lease, error: LeaseError) -> None:
        """A held lease the engine would not adopt (closed meanwhile): it is lost."""
        self._keys.pop(id(lease), None)
        self._leases.pop(key, None)
        self._outbox.put(_lost(key, error))


def _opened(frames: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``frames`` with each ``Batch`` opened: the frames it carries, in order."""
    opened: list[tuple[Any, ...]] = []
    for frame in frames:
        if isinstance(frame, Batch):
            opened += frame.frames
        else:
            opened.append(frame)
    return opened


def _message_of(frame: Add, queues: Sequence[Backend]) -> Message:
    """The message of the lease ``frame`` names, as far as renewing it goes."""
    return Message(
        id=frame.message_id,
        # The body, attributes and group (Message.group) stay in the worker: the
        # renewer reads none of them, and the handler's message is the worker's.
        body="",
        receipt=frame.receipt,
        backend=queues[frame.queue],
        received_at=frame.received_at,
        visibility_timeout=frame.visibility_timeout,
        receive_count=frame.receive_count,
        deadline_hint=frame.deadline_hint,
        hard_deadline=frame.hard_deadline,
    )


def _taken_over(
    adopted: Adopted, queues: Sequence[Backend], held: HeldLeases, renewer: ThreadRenewer
) -> tuple[Lease, bool]:
    """The lease a renewer process that died held, here: renewed from now on as it
    was there (its newest receipt and deadline, its registration, extensions and
    progress) - or held back still (True) where the worker may delete its message
    itself. LeaseError once closed."""
    add = Add._make(adopted.add)
    message = _message_of(add, queues)
    message.visible_until = adopted.visible_until  # extended since it was received
    if add.own and not add.watch:
        lease = held.hold(add.key, add.queue, message, own=True)
        if lease is not None:
            lease.registered_at = adopted.registered_at
            if adopted.progressed_at is not None:
                lease.progressed_at = adopted.progressed_at
            return lease, True
    lease = renewer.take_over(
        message,
        registered_at=adopted.registered_at,
        extensions=adopted.extensions,
        progressed_at=adopted.progressed_at,
        watch=add.watch,
    )
    return lease, False


def _lost(key: int, error: LeaseError) -> Ended:
    """The notice of a lease that could not be renewed here (refused, or closed)."""
    return Ended(key, LeaseState.LOST.value, LostReason.LAPSED.value, str(error), True)


def _unknown() -> LeaseError:
    return LeaseError("the renewer holds no such lease (it ended there)")


def main(argv: Sequence[str]) -> int:
    for ignored in (signal.SIGINT, signal.SIGTERM):
        signal.signal(ignored, signal.SIG_IGN)
    conn = Channel(int(argv[1]))
    doorbell = Doorbell(conn.fileno(), int(argv[2]))
    hello: Hello = recv_frame(conn)
    sys.path[:0] = [entry for entry in hello.path if entry not in sys.path]
    watch = DeathWatch(hello.parent)
    renewer: ChildRenewer | None = None
    outbox: Outbox | None = None
    try:
        watch.start()
        try:
            spec, config, *more = pickle.loads(hello.payload)
        except Exception as exc:
            send_frame(conn, Failed(f"{type(exc).__name__}: {exc}"))
            return 1
        # Started: the backend is built next (its SDK's import is most of a second),
        # while the worker waits for Serving; if it dies meanwhile, what it sent is
        # read and released once we can.
        send_frame(conn, Started(os.getpid()))
        watch.defer()
        try:
            manager = build_manager(spec, config)
            # A multi-queue worker's other queues, each rebuilt from its spec.
            more_queues = [other.build() for other in (more[0] if more else ())]
        except Exception as exc:
            # Type and text: a spec's build error says what is missing (an environment
            # variable, a credential) and, by the specs' design, holds no secret.
            with contextlib.suppress(OSError):
                send_frame(conn, Failed(f"{type(exc).__name__}: {exc}"))
            return 1
        outbox = Outbox(conn)
        renewer = ChildRenewer(conn, doorbell, manager, outbox, more_queues)
        if watch.resume():
            renewer.serve(watch, gone=True)
        else:
            outbox.put(Serving())  # through the sender thread, the only one that sends
            renewer.serve(watch)
    except WorkerGone:
        # The worker died before serve() could take the notice; the watch is settled,
        # so this release cannot be interrupted.
        if renewer is not None:
            renewer.serve(watch, gone=True)
    finally:
        if outbox is not None:
            outbox.close()
    return 0


def build_manager(spec: Any, config: Any) -> LeaseManager:
    """The thread-mode manager on the backend ``spec`` builds here. (Credentials it
    would lack were asked of the worker's own backend, in the same environment,
    while this process started: ``renewers._link``'s precheck.)"""
    return LeaseManager(spec.build(), LeaseConfig.from_fields(config, {}), renewer="thread")


if __name__ == "__main__":
    logging.basicConfig(
        level=os.environ.get("LEASEKEEPER_RENEWER_LOG", "WARNING"),
        format="%(asctime)s leasekeeper-renewer[%(process)d] %(name)s: %(message)s",
    )
    sys.exit(main(sys.argv))

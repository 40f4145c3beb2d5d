"""``Succession``: a process renewer's renewer processes, one after another.

``renewers.process.ProcessRenewer`` talks to one renewer process at a time, through
a ``RenewerLink`` (``renewers._link``). This module keeps which one that is: it
starts the first, and when one dies while the worker lives (the OOM killer, a
SIGKILL), it starts the next at once and has it **take over** every lease the
dead one held, before any lapses:

1. the worker learns of the death from the end of file on its socket (every frame
   the dead renewer wrote before it died - new receipts and deadlines among them -
   has been read and applied by then);
2. a new renewer process is started and waited for until it serves (building its
   backend: most of a second); meanwhile every thread that sends or asks waits for
   it, and a request the dead one never answered is asked again of the new one;
3. under the registry lock the worker hands it every active lease in one ``Adopt``
   frame (its first), each as the worker knows it - its newest receipt, its
   deadline, when it was registered, its extensions and progress - and only then
   makes it the current renewer. A lease whose deadline passed during the gap is
   lost (``renewer_died``): on SQS nothing proves nobody else received its
   message since (rule 5). One WARNING says how long the gap was.

Why the receipts the worker hands on are safe (rule 5). The worker knows a lease's
receipt from the dead renewer's ``Extended`` notices, all of which it read before
the end of file. Where receipts do not rotate (SQS, Redis) the receipt never
changes, and a deadline the worker missed the news of is earlier than the
service's (rule 1): conservative. Where they rotate (MNS, Azure) the dead renewer
may have had an extend answered - a new receipt issued - and died before it could
write the notice: the receipt handed on is then stale, and the service refuses it
(MNS ``ReceiptHandleError``, Azure ``PopReceiptMismatch``), so the new renewer's
first extend ends that lease lost (``rejected``) and its handler is told: a stale
receipt can never keep a message another consumer has, nor delete it. The window
is the few microseconds between an extend's answer and its notice's write.

Leases whose message the worker is deleting itself at the death (``deleting``:
held back, never renewed, ``renewers._own``) are not handed on: if that delete
fails, its ``Complete`` brings the lease to the new renewer. A worker's own delete
goes ahead only if the renewer its ``Drop`` went to is still the current one
(``OwnDeletes`` checks ``current()`` under the registry lock, where the takeover
decides): otherwise the new renewer may have adopted the lease, and the delete is
its to do.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from leasekeeper.backends.contract import Backend
from leasekeeper.errors import ConfigError, LeaseLost, ManagerClosed
from leasekeeper.lease import WatchLease
from leasekeeper.renewers._frames import Add, Adopt, Adopted
from leasekeeper.renewers._link import DIED, START_TIMEOUT, LinkMaker, RenewerLink
from leasekeeper.renewers._remote_lease import RemoteLease

log = logging.getLogger("leasekeeper.renewer")

#: Renewer processes started in a row to take over from one that died.
TAKEOVER_ATTEMPTS = 3
#: The longest a thread waits for a takeover: each attempt starts and builds.
TAKEOVER_WAIT = TAKEOVER_ATTEMPTS * 2 * START_TIMEOUT
#: Sends and requests tried again on the next renewer when theirs dies.
RETRIES = 3

#: Under the registry lock, at ``now``: the ``Adopt`` entries of the leases to hand
#: on, and the leases that lapsed (ended lost by ``Lost``, outside the lock).
HandOver = Callable[[float], tuple[list[tuple[Any, ...]], list[Any]]]
#: The lapsed leases, and the words of their ending.
Lost = Callable[[list[Any], str], None]


class Succession:
    """The current renewer process's link and its successors (see the module
    docstring). ``lock`` is the process renewer's registry lock: it guards the link
    here too, so a takeover hands over the leases registered until it is done.
    ``apply`` is given every frame a link reads that is not a reply; ``hand_over``
    and ``lost`` are the process renewer's side of a takeover; ``is_closed`` says
    whether it was closed (read under ``lock``)."""

    def __init__(
        self,
        maker: LinkMaker,
        lock: threading.Lock,
        *,
        apply: Callable[[tuple[Any, ...]], None],
        hand_over: HandOver,
        lost: Lost,
        is_closed: Callable[[], bool],
        now: Callable[[], float],
        after: Callable[[], None] = lambda: None,
    ) -> None:
        self._maker = maker
        self._lock = lock
        self._changed = threading.Condition(lock)  # the link changed, or a takeover ended
        self._apply = apply
        self._hand_over = hand_over
        self._lost = lost
        self._is_closed = is_closed
        self._now = now
        self._after = after  # once a takeover is done (outside the lock)
        self.link: RenewerLink | None = None  # the current renewer's, once published
        self.replacing = False  # a takeover is under way: threads wait for it
        self.replaced = 0  # renewer processes that took over from one that died

    @property
    def taking_over(self) -> bool:
        """A takeover is under way - or about to be: the current renewer's process has
        ended and its reader has not seen the end of file yet (``gone`` then starts
        the takeover, unless the manager closed or no renewer can be built)."""
        link = self.link
        dead = link is not None and not link.alive
        return self.replacing or (dead and not (self._is_closed() or self._maker.unbuildable))

    # ------------------------------------------------------------------ the current one

    def current(self, stale: RenewerLink | None = None) -> RenewerLink | None:
        """The current renewer's link, once a takeover under way is done - and, given
        ``stale`` (a link found dead), once it has been replaced. None when there is
        none (closed, or no renewer could be started)."""
        deadline = time.monotonic() + TAKEOVER_WAIT
        with self._changed:
            while self.replacing or (
                stale is not None and self.link is stale and not self._is_closed()
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)
            link = self.link
        return None if link is stale else link

    def start_locked(self) -> RenewerLink | None:
        """Under the lock: the current link, a new renewer started when there is none
        and no takeover is under way (the last died and no successor could start).
        ConfigError when none can be."""
        if self.link is None and not self.replacing:
            self.link = self._maker.start(self._apply, self.gone)
        return self.link

    def serving(self) -> RenewerLink:
        """The renewer, once it renews (a new one if there is none); ConfigError when
        it cannot, ManagerClosed once closed - so no lease is held for one that
        never will."""
        for _ in range(RETRIES + 1):
            self.current()  # a takeover under way: its successor
            with self._lock:
                if self._is_closed():
                    raise ManagerClosed("this LeaseManager is closed")
                link = self.start_locked()
            if link is None:
                continue  # a takeover began meanwhile
            if not link.serving:
                try:
                    link.wait_serving()
                except ConfigError:
                    link.kill()  # one that took too long; it held nothing
                    raise
            return link
        raise ConfigError("the renewer process could not start: it kept dying")

    # ------------------------------------------------------------------ talking to it

    def send(self, frame: tuple[Any, ...], urgent: bool = True) -> RenewerLink:
        """Send ``frame`` to the current renewer (waiting out a takeover; sent again to
        the next one if this one turns out dead); the link it went to. LeaseLost when
        there is no renewer. A frame a renewer received and died before reading is
        lost with it: the takeover hands on what it was for (the leases as they are)."""
        stale: RenewerLink | None = None
        for _ in range(RETRIES + 1):
            link = self.current(stale)
            if link is None:
                break
            try:
                link.send(frame, urgent=urgent)
                return link
            except LeaseLost:
                stale = link
        raise LeaseLost("-", DIED)

    def ask(self, make: Callable[[int], tuple[Any, ...]], *, again: bool = True) -> Any:
        """The reply's payload to the request ``make(request id)``; asked again of the
        next renewer when this one dies first (``again``); ``DIED`` when none answers."""
        stale: RenewerLink | None = None
        for _ in range(RETRIES + 1):
            link = self.current(stale)
            if link is None:
                break
            payload = link.ask(make)
            if payload != DIED or not again or self._is_closed():
                return payload
            stale = link
        return DIED

    # ------------------------------------------------------------------ a death

    def gone(self, link: RenewerLink) -> None:
        """``link``'s renewer died (on its reader thread): if it was the current one, a
        new renewer takes its leases over (see the module docstring)."""
        died = self._now()
        with self._lock:
            self._maker.ended(link)
            if self.link is not link:
                return  # never published (a takeover started it and saw it die)
            self.link = None
            replace = not (self._is_closed() or self._maker.unbuildable)
            if not replace:
                _, lapsed = self._hand_over(math.inf)  # nobody to hand them to
                self._changed.notify_all()
            self.replacing = replace
        if not replace:
            self._lost(lapsed, DIED)  # (outside the lock: ending a lease takes it)
            return
        successor: RenewerLink | None = None
        try:
            successor = self._successor()
        finally:
            with self._lock:
                self.replacing = False
                now = self._now()
                entries, lapsed = self._hand_over(now if successor is not None else math.inf)
                if successor is not None and not entries and self._is_closed():
                    successor.closing = True  # closed meanwhile, with nothing to hand on
                    successor.kill()
                    successor = None
                if successor is not None:
                    try:
                        successor.send(Adopt(entries))
                        self.link = successor
                        self.replaced += 1
                    except LeaseLost:  # it died at once
                        entries, lapsed = self._hand_over(math.inf)
                        successor = None
                self._changed.notify_all()
        gap = now - died
        if successor is None:
            log.error(
                "renewer process %d died and no other could take over: %d lease(s) lost",
                link.pid,
                len(lapsed),
            )
            self._lost(lapsed, DIED)
            return
        log.warning(
            "renewer process %d took over %d lease(s) from renewer process %d, %.2fs after "
            "it died%s",
            successor.pid,
            len(entries),
            link.pid,
            gap,
            f"; {len(lapsed)} lost: their deadlines passed meanwhile" if lapsed else "",
        )
        self._lost(
            lapsed,
            f"{DIED}, and the lease's deadline passed during the {gap:.1f}s before "
            "another took over",
        )
        self._after()

    def _successor(self) -> RenewerLink | None:
        """A new renewer, once it serves (not yet published); None when none could be
        started (each failure logged)."""
        for _ in range(TAKEOVER_ATTEMPTS):
            try:
                with self._lock:
                    if self._maker.unbuildable:
                        return None
                successor = self._maker.start(self._apply, self.gone)
            except ConfigError as exc:
                log.error("%s", exc)
                continue
            except Exception as exc:  # OSError: no process could start (a process limit)
                log.error("the renewer process could not start: %s: %s", type(exc).__name__, exc)
                continue
            try:
                successor.wait_serving()
            except ConfigError as exc:
                log.error("%s", exc)
                successor.kill()
                continue
            with self._lock:
                if not successor.ended:
                    return successor
        return None

    # ------------------------------------------------------------------ the end

    def stop(self) -> RenewerLink | None:
        """For close(): the current link, once a takeover under way is done (its
        successor then holds the leases that close() releases)."""
        return self.current()

    def abandon(self) -> None:
        """The renewer could not be constructed: stop what was started (it held nothing)."""
        with self._lock:
            link, self.link = self.link, None
        if link is not None:
            link.closing = True
            with contextlib.suppress(OSError):
                link.kill()

    def drop(self) -> None:
        """In a forked child of the worker: the renewer is the parent's; let go of it."""
        link, self.link = self.link, None
        if link is not None:
            link.drop()


def handed_on(
    leases: Iterable[RemoteLease], index: Callable[[Backend], int | None], now: float
) -> tuple[list[tuple[Any, ...]], list[RemoteLease]]:
    """What a successor takes over of ``leases`` (the worker's, under its registry
    lock): the ``Adopt`` entries of those it renews from now on, and those whose
    deadline passed by ``now`` (lost). Not the leases whose message the worker is
    deleting itself (held back, never renewed): their ``Complete`` brings them to
    the successor if that delete fails. ``index``: a message's queue's number."""
    handed: list[tuple[Any, ...]] = []
    lapsed: list[RemoteLease] = []
    for lease in leases:
        if lease.deleting:
            continue
        if lease.visible_until <= now:
            lapsed.append(lease)
        else:
            handed.append(_adopted(lease, index(lease.message.backend) or 0, now))
    return handed, lapsed


def _adopted(lease: RemoteLease, queue: int, now: float) -> tuple[Any, ...]:
    """``lease`` as a successor gets it (``Adopted``, as a plain tuple): its newest
    receipt and deadline, its registration, extensions and progress; still the
    worker's to delete itself (held back there) until ``own_until``."""
    message = lease.message
    add = Add(
        lease.key,
        message.id,
        lease.receipt,
        message.received_at,
        message.visibility_timeout,
        message.deadline_hint,
        message.hard_deadline,
        message.receive_count,
        isinstance(lease, WatchLease),
        queue,
        lease.own_until > now,
    )
    progressed: float | None = getattr(lease, "progressed_at", None)
    return tuple(
        Adopted(tuple(add), lease.visible_until, lease.registered_at, lease.extensions, progressed)
    )

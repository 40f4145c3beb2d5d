"""The workers' fleet options, made into listeners: ``attach``.

``Worker`` and ``AsyncWorker`` take ``scale_in_protection=`` and
``interruption_notice=`` and hand them here, so both read them the same way: True
(or a ``ScaleInProtection`` of your own) adds ECS task scale-in protection; a cloud's
name ("aws", "azure", "alibaba"), a ``NoticeSource`` or an ``InterruptionWatch``
adds the watch for interruption notices. Both become the worker's listeners, bound
to its clock and its ``drain``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from leasekeeper.clock import Clock
from leasekeeper.fleet.ecs import ScaleInProtection
from leasekeeper.fleet.interruption import InterruptionWatch
from leasekeeper.fleet.notices import NoticeSource, notice_source
from leasekeeper.manager import LeaseManager
from leasekeeper.receiving import Intake
from leasekeeper.receiving.listeners import Listeners

__all__ = ["InterruptionOption", "ProtectionOption", "attach"]

#: What ``scale_in_protection=`` takes.
ProtectionOption = bool | ScaleInProtection
#: What ``interruption_notice=`` takes.
InterruptionOption = str | NoticeSource | InterruptionWatch | None


class Followed(Protocol):
    """What ``attach`` needs of a worker."""

    clock: Clock
    manager: LeaseManager
    intake: Intake

    @property
    def listeners(self) -> Listeners: ...

    def drain(self, deadline: float | None = None) -> None: ...


def attach(
    worker: Followed, *, protection: ProtectionOption = False, notice: InterruptionOption = None
) -> None:
    """Add the listeners ``scale_in_protection`` (``protection``) and
    ``interruption_notice`` (``notice``) ask for to ``worker`` (see the module
    docstring); ``TypeError``/``ValueError`` naming the option for what it cannot take
    (the manager the worker made is closed then: the worker is never returned)."""
    try:
        _attach(worker, protection, notice)
    except BaseException:
        if worker.intake.owns_manager:
            worker.manager.close()
        raise


def _attach(
    worker: Followed, scale_in_protection: ProtectionOption, interruption_notice: InterruptionOption
) -> None:
    if isinstance(scale_in_protection, ScaleInProtection):
        worker.listeners.add(scale_in_protection)
    elif scale_in_protection is True:
        worker.listeners.add(ScaleInProtection(clock=worker.clock))
    elif scale_in_protection is not False:
        raise TypeError(
            "scale_in_protection takes True, False or a ScaleInProtection, got "
            f"{scale_in_protection!r}"
        )
    if interruption_notice is None:
        return
    drain: Callable[[float], None] = worker.drain
    if isinstance(interruption_notice, InterruptionWatch):
        watch = interruption_notice.bind(drain, worker.clock)
    elif isinstance(interruption_notice, str):
        source = notice_source(interruption_notice, clock=worker.clock)
        watch = InterruptionWatch(source, drain, clock=worker.clock)
    elif isinstance(interruption_notice, NoticeSource):
        watch = InterruptionWatch(interruption_notice, drain, clock=worker.clock)
    else:
        raise TypeError(
            "interruption_notice takes 'aws', 'azure', 'alibaba', a NoticeSource or an "
            f"InterruptionWatch, got {type(interruption_notice).__name__}"
        )
    worker.listeners.add(watch)

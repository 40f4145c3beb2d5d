"""OpenTelemetry metrics (and handler spans) for a LeaseManager: ``instrument(manager)``.

``pip install 'leasekeeper[otel]'`` (``opentelemetry-api`` only: the application
picks and configures the SDK and its exporters). ``instrument(manager)`` adds an
``Observer`` to the manager and records on the meter ``leasekeeper``:

| instrument | kind | unit | what |
|---|---|---|---|
| messaging.client.operation.duration | histogram | s | every extend, delete, release call |
| leasekeeper.extensions | counter | {extension} | extend entries, by outcome |
| leasekeeper.leases.lost | counter | {lease} | leases lost or abandoned, by reason |
| leasekeeper.lapses | counter | {lapse} | deadlines passed before an extend |
| leasekeeper.renewal.headroom | histogram | s | time left when an extend answered |
| leasekeeper.leases.in_flight | gauge | {lease} | ``stats().in_flight`` |
| leasekeeper.scheduler.lag | gauge | s | ``stats().scheduler_lag_p50/p99`` |
| leasekeeper.scheduler.send_lag | gauge | s | ``stats().send_lag_p50/p99`` |
| leasekeeper.extend.threshold | gauge | s | ``stats().extend_threshold`` |
| leasekeeper.worker.busy_ratio | gauge | 1 | a worker's running handlers over its concurrency |
| leasekeeper.queue.backlog | gauge | {message} | a worker's queues, counted (``backlog_every``) |

docs/observability.md has the attributes of each and why. Given a ``Worker`` (or
an ``AsyncWorker``), ``instrument(worker)`` also wraps each handler run in a ``process`` span (kind
CONSUMER) and records ``messaging.process.duration``; with ``backlog_every=S`` it
counts the worker's queues every S seconds (``leasekeeper.fleet.BacklogSampler``).

Traces cross the queue: the ``process`` span continues the trace whose W3C context
(``traceparent``, ``tracestate``, ``baggage``) the message's attributes carry, read
through the globally configured propagator (``opentelemetry.propagate.extract``);
the handler runs in that context, its baggage included. A producer that sends
through leasekeeper puts the current context in a message's attributes with
``inject(attributes)`` - or OpenTelemetry's own ``propagate.inject`` into the dict
it sends.

Without an SDK configured (no ``meter_provider``/``tracer_provider`` given and
none set globally) every instrument is the API's no-op: instrumenting costs a few
calls per backend call and records nothing.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from leasekeeper.errors import install_hint

try:
    from opentelemetry import context, metrics, propagate, trace
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "leasekeeper.otel needs the OpenTelemetry API: " + install_hint("otel")
    ) from exc

from leasekeeper.aio.worker import AsyncWorker
from leasekeeper.backends.contract import Message
from leasekeeper.fleet.autoscaling import BacklogSampler, busy_ratio
from leasekeeper.lease import LeaseState
from leasekeeper.manager import LeaseManager
from leasekeeper.observers import CallEvent, Observer
from leasekeeper.reasons import LostReason
from leasekeeper.receiving import queue_name, unwrapped
from leasekeeper.rollover import send_with_attributes
from leasekeeper.worker import Worker

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

    from leasekeeper.record import LeaseRecord

__all__ = [
    "SYSTEMS",
    "Instrumentation",
    "backend_attributes",
    "destination_name",
    "error_type",
    "inject",
    "instrument",
    "messaging_system",
    "send",
    "trace_context",
]

SCOPE = "leasekeeper"

# Attribute names: the messaging semantic conventions', and leasekeeper's own.
SYSTEM = "messaging.system"
OPERATION_NAME = "messaging.operation.name"
OPERATION_TYPE = "messaging.operation.type"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
ERROR_TYPE = "error.type"
OUTCOME = "leasekeeper.extend.outcome"
STATE = "leasekeeper.lease.state"
REASON = "leasekeeper.lease.reason"
QUANTILE = "leasekeeper.quantile"

#: messaging.system of the backends that ship with leasekeeper, by the module that
#: defines them. ``aws_sqs`` is the conventions' own; the conventions name no
#: value for MNS or Azure Storage Queue, so these follow their newest member
#: (``aws.sns``): the ``cloud.provider`` value, a dot, the service.
SYSTEMS: Mapping[str, str] = {
    "leasekeeper.backends.sqs.backend": "aws_sqs",
    "leasekeeper.backends.mns": "alibaba_cloud.mns",
    "leasekeeper.backends.azure": "azure.storage_queue",
    "leasekeeper.backends.memory": "leasekeeper.memory",
}

# Worst first: the error.type of a call that answered but not "ok" for every entry.
_FAILED_KINDS = ("fatal", "lost", "capped", "retry")

# messaging.client.operation.duration's boundaries, as the conventions advise.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
# Renewal headroom: from "answered after the deadline" (<= 0) to an hour.
HEADROOM_BUCKETS = (0, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

Attributes = dict[str, "AttributeValue"]


def error_type(event: CallEvent) -> str | None:
    """``error.type`` of a backend call: the exception type it raised (or
    "malformed"), else the worst outcome kind among its entries (fatal, lost,
    capped, retry), else None: every entry answered "ok"."""
    if event.error is not None:
        return event.error
    for kind in _FAILED_KINDS:
        if kind in event.outcomes:
            return kind
    return None


def messaging_system(backend: object) -> str:
    """``messaging.system`` for ``backend``: its own ``messaging_system`` attribute when
    it has one (a backend of your own may set it), else the value in ``SYSTEMS`` for
    the leasekeeper backend it is or wraps, else its class name."""
    own = getattr(backend, "messaging_system", None)
    if isinstance(own, str) and own:
        return own
    inner = unwrapped(backend)
    for cls in type(inner).__mro__:
        system = SYSTEMS.get(cls.__module__)
        if system is not None:
            return system
    return type(inner).__name__


def destination_name(backend: object) -> str | None:
    """``messaging.destination.name``: the queue's name where the backend knows it
    (``queue_name``; the last part of an SQS ``queue_url``; a MemoryQueue's ``name``)."""
    return queue_name(backend)


def backend_attributes(backend: object) -> Attributes:
    """``messaging.system`` and, where known, ``messaging.destination.name``."""
    attributes: Attributes = {SYSTEM: messaging_system(backend)}
    destination = destination_name(backend)
    if destination is not None:
        attributes[DESTINATION] = destination
    return attributes


class _Instruments:
    """The instruments of one meter provider, shared by every manager instrumented
    with it: the SDK hands back an instrument already created under a name, and an
    observable's second set of callbacks would be dropped. So the observable gauges
    have one callback each, which reads every instrumented manager."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.lock = threading.Lock()
        self.handles: list[Instrumentation] = []
        self.duration = meter.create_histogram(
            "messaging.client.operation.duration",
            unit="s",
            description="Duration of the extend, delete and release calls leasekeeper makes.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.extensions = meter.create_counter(
            "leasekeeper.extensions",
            unit="{extension}",
            description="Extend entries by outcome: ok (the lease was renewed), lost, "
            "retry, capped, fatal.",
        )
        self.lost = meter.create_counter(
            "leasekeeper.leases.lost",
            unit="{lease}",
            description="Leases lost or abandoned, by state and reason class.",
        )
        self.lapses = meter.create_counter(
            "leasekeeper.lapses",
            unit="{lapse}",
            description="Lease deadlines that passed before an extend was sent.",
        )
        self.headroom = meter.create_histogram(
            "leasekeeper.renewal.headroom",
            unit="s",
            description="Time left before the old deadline when an extend was answered.",
            explicit_bucket_boundaries_advisory=HEADROOM_BUCKETS,
        )
        self.process = meter.create_histogram(
            "messaging.process.duration",
            unit="s",
            description="Duration of a Worker's handler(message) calls.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        meter.create_observable_gauge(
            "leasekeeper.leases.in_flight",
            callbacks=[self._observe_in_flight],
            unit="{lease}",
            description="Leases held: registered and not yet ended.",
        )
        meter.create_observable_gauge(
            "leasekeeper.scheduler.lag",
            callbacks=[self._observe_lag],
            unit="s",
            description="How late the scheduler woke for the earliest due lease "
            "(p50 and p99 of the last 2,048 wake-ups).",
        )
        meter.create_observable_gauge(
            "leasekeeper.scheduler.send_lag",
            callbacks=[self._observe_send_lag],
            unit="s",
            description="Due time to extend sent, waiting for a dispatch thread included "
            "(p50 and p99 of the last 2,048 extends).",
        )

        meter.create_observable_gauge(
            "leasekeeper.extend.threshold",
            callbacks=[self._observe_threshold],
            unit="s",
            description="The extend threshold in force: a lease is renewed when less than "
            "this remains (it moves with extend_threshold='auto').",
        )
        meter.create_observable_gauge(
            "leasekeeper.worker.busy_ratio",
            callbacks=[self._observe_busy],
            unit="1",
            description="A worker's running handlers over its concurrency, 0 to 1.",
        )
        meter.create_observable_gauge(
            "leasekeeper.queue.backlog",
            callbacks=[self._observe_backlog],
            unit="{message}",
            description="Messages waiting for a worker, as the queue service counted them "
            "at the last count (visible ones; Azure: all of them).",
        )

    def workers(self) -> list[Instrumentation]:
        """The live handles of instrumented workers."""
        self.live()  # drops the handles of collected managers
        with self.lock:
            return [handle for handle in self.handles if handle.worker is not None]

    def _observe_busy(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        return [
            metrics.Observation(busy_ratio(handle.worker), handle.attributes)
            for handle in self.workers()
            if handle.worker is not None
        ]

    def _observe_backlog(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        found = []
        for handle in self.workers():
            sampler = handle.sampler
            if sampler is None:
                continue
            counts = sampler.backlog()
            for name, queue in sampler.queues:
                if name in counts:
                    found.append(metrics.Observation(counts[name], backend_attributes(queue)))
        return found

    def live(self) -> list[tuple[LeaseManager, Attributes]]:
        """The instrumented managers still alive, with their attributes (handles of
        managers that were garbage-collected unremoved are dropped here)."""
        found = []
        with self.lock:
            kept = []
            for handle in self.handles:
                manager = handle.manager
                if manager is not None:
                    kept.append(handle)
                    found.append((manager, handle.attributes))
            self.handles = kept
        return found

    def _observe_in_flight(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        # Managers of one queue add up; a multi-queue worker's manager counts per queue.
        totals: dict[tuple[tuple[str, AttributeValue], ...], int] = {}
        for manager, attributes in self.live():
            for each, count in _in_flight_by_queue(manager, attributes):
                key = tuple(sorted(each.items()))
                totals[key] = totals.get(key, 0) + count
        return [metrics.Observation(value, dict(key)) for key, value in totals.items()]

    def _observe_threshold(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        # Managers of one queue: the thinnest margin of them.
        least: dict[tuple[tuple[str, AttributeValue], ...], float] = {}
        for manager, attributes in self.live():
            key = tuple(sorted(attributes.items()))
            value = manager.stats().extend_threshold
            least[key] = min(least.get(key, value), value)
        return [metrics.Observation(value, dict(key)) for key, value in least.items()]

    def _observe_lag(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        return self._quantiles("scheduler_lag")

    def _observe_send_lag(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        return self._quantiles("send_lag")

    def _quantiles(self, field: str) -> list[metrics.Observation]:
        # Managers of one queue: the worst of them.
        worst: dict[tuple[tuple[str, AttributeValue], ...], float] = {}
        for manager, attributes in self.live():
            stats = manager.stats()
            for quantile, suffix in ((0.5, "_p50"), (0.99, "_p99")):
                key = tuple(sorted({**attributes, QUANTILE: quantile}.items()))
                worst[key] = max(worst.get(key, 0.0), getattr(stats, field + suffix))
        return [metrics.Observation(value, dict(key)) for key, value in worst.items()]


def _in_flight_by_queue(
    manager: LeaseManager, attributes: Attributes
) -> list[tuple[Attributes, int]]:
    """``manager``'s leases in flight, per queue (with each queue's attributes) when it
    renews several, else in all (with ``attributes``)."""
    queues = manager.queues
    if len(queues) < 2:
        return [(attributes, manager.stats().in_flight)]
    counts: dict[int, int] = {}
    for lease in manager.leases():
        counts[id(lease.message.backend)] = counts.get(id(lease.message.backend), 0) + 1
    return [(backend_attributes(queue), counts.get(id(queue), 0)) for queue in queues]


# One set of instruments per meter provider (weakly: a provider dropped by its
# application, as a test's is, takes them with it).
_SHARED: weakref.WeakKeyDictionary[object, _Instruments] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def _instruments_for(provider: metrics.MeterProvider) -> _Instruments:
    with _SHARED_LOCK:
        found = _SHARED.get(provider)
        if found is None:
            from leasekeeper import __version__

            found = _Instruments(provider.get_meter(SCOPE, __version__))
            _SHARED[provider] = found
        return found


class _Recorder(Observer):
    """The observer ``instrument`` adds: backend calls, extensions, lapses, endings."""

    def __init__(self, instruments: _Instruments) -> None:
        self._i = instruments
        # Per backend: (the backend, its attributes). The backend is kept so that an
        # id is never reused for another one while this recorder lives.
        self._backends: dict[int, tuple[object, Attributes]] = {}

    def _attributes(self, backend: object) -> Attributes:
        found = self._backends.get(id(backend))
        if found is None or found[0] is not backend:
            found = (backend, backend_attributes(backend))
            self._backends[id(backend)] = found
        return found[1]

    def on_call(self, event: CallEvent) -> None:
        base = self._attributes(event.backend)
        attributes = {**base, OPERATION_NAME: event.operation, OPERATION_TYPE: "settle"}
        error = error_type(event)
        if error is not None:
            attributes[ERROR_TYPE] = error
        self._i.duration.record(event.seconds, attributes)
        if event.operation == "extend":
            for kind in event.outcomes:
                if kind != "ok":  # "ok" is counted when the renewal took effect
                    self._i.extensions.add(1, {**base, OUTCOME: kind})

    def on_extended(self, lease: LeaseRecord, headroom: float) -> None:
        base = self._attributes(lease.message.backend)
        self._i.extensions.add(1, {**base, OUTCOME: "ok"})
        self._i.headroom.record(headroom, base)

    def on_lapse(self, lease: LeaseRecord, late: float) -> None:
        self._i.lapses.add(1, self._attributes(lease.message.backend))

    def on_ended(self, lease: LeaseRecord, state: LeaseState, reason: str) -> None:
        if state is LeaseState.LOST or state is LeaseState.ABANDONED:
            attributes = {
                **self._attributes(lease.message.backend),
                STATE: state.value,
                REASON: (lease.lost_reason or LostReason.LAPSED).value,
            }
            self._i.lost.add(1, attributes)


def inject(attributes: dict[str, str] | None = None) -> dict[str, str]:
    """Add the current OpenTelemetry context (``traceparent``, ``tracestate``,
    ``baggage``: whatever the globally configured propagator writes) to ``attributes``
    and return it (a new dict when None): send it as the message's attributes,
    ``backend.send(body, attributes=inject({...}))``, and an instrumented worker
    processes the message in the sender's trace."""
    carrier: dict[str, str] = {} if attributes is None else attributes
    propagate.inject(carrier)
    return carrier


def send(
    backend: object,
    body: str | bytes,
    attributes: Mapping[str, str] | None = None,
    **options: Any,
) -> str:
    """Send ``body`` to ``backend`` with ``attributes`` and the current context
    (``inject``), on any service: as message attributes where it carries them (SQS,
    MNS, Redis Streams, MemoryQueue), else (Azure Storage queues) in an envelope that
    the workers take off before the handler sees the message. Returns the message id;
    ``options`` go to ``backend.send`` (``delay=``)."""
    return send_with_attributes(backend, body, inject(dict(attributes or {})), **options)


def trace_context(message: Message) -> context.Context:
    """The context ``message``'s attributes carry (through the global propagator),
    on top of the current one: the current context when they carry none."""
    attributes = getattr(message, "attributes", None)
    current = context.get_current()
    if not attributes:
        return current
    return propagate.extract(attributes, context=current)


def _process_span_name(attributes: Attributes) -> str:
    destination = attributes.get(DESTINATION)
    return f"process {destination}" if destination else "process"


class Instrumentation:
    """What ``instrument`` returns (made only by it): ``uninstrument()`` stops
    recording (call it, or ``with instrument(manager):``). Instruments already
    created stay with their meter provider, as OpenTelemetry's do; their callbacks
    skip this manager from then on."""

    def __init__(
        self,
        manager: LeaseManager,
        instruments: _Instruments,
        worker: Worker | AsyncWorker | None,
        tracer: trace.Tracer | None,
    ) -> None:
        self._manager = weakref.ref(manager)
        self._instruments = instruments
        self._recorder = _Recorder(instruments)
        self._worker = worker
        self._tracer = tracer
        #: The worker's queue counts (``instrument(worker, backlog_every=S)``).
        self.sampler: BacklogSampler | None = None
        self.attributes: Attributes = (
            {} if manager.backend is None else backend_attributes(manager.backend)
        )
        if len(manager.queues) > 1:  # several queues: the manager's own figures name none
            self.attributes.pop(DESTINATION, None)
        self._active = False

    @property
    def manager(self) -> LeaseManager | None:
        """The instrumented manager (None once uninstrumented or collected)."""
        return self._manager() if self._active else None

    @property
    def active(self) -> bool:
        return self._active

    @property
    def worker(self) -> Worker | AsyncWorker | None:
        """The instrumented worker (None for a manager, or once uninstrumented)."""
        return self._worker if self._active else None

    def start(self) -> None:
        """Start recording (``instrument`` does it; twice would record twice)."""
        manager = self._manager()
        assert manager is not None
        with self._instruments.lock:
            self._instruments.handles.append(self)
        manager.add_observer(self._recorder)
        if self._worker is not None:
            self._worker.around_handler = self._around
        self._active = True

    def uninstrument(self) -> None:
        """Stop recording this manager (and its worker's spans). Twice does nothing."""
        if not self._active:
            return
        self._active = False
        manager = self._manager()
        if manager is not None:
            manager.remove_observer(self._recorder)
        with self._instruments.lock:
            self._instruments.handles = [h for h in self._instruments.handles if h is not self]
        if self.sampler is not None:
            self.sampler.close()
        worker = self._worker
        if worker is not None and worker.around_handler == self._around:
            worker.around_handler = None

    def _around(self, message: Message) -> AbstractContextManager[object]:
        assert self._tracer is not None
        return _process(self._tracer, self._instruments.process, message, self._manager())

    def __enter__(self) -> Instrumentation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstrument()

    def __repr__(self) -> str:
        state = "active" if self._active else "removed"
        return f"<leasekeeper.otel.Instrumentation {state} {self.attributes}>"


def instrument(
    target: LeaseManager | Worker | AsyncWorker,
    *,
    meter_provider: metrics.MeterProvider | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    backlog_every: float | None = None,
) -> Instrumentation:
    """Record OpenTelemetry metrics of ``target`` (a ``LeaseManager``, or a ``Worker``
    or ``leasekeeper.aio.AsyncWorker``: then its manager, plus a span around each
    handler run and its busy ratio) until ``uninstrument()``.

    ``meter_provider``/``tracer_provider``: the global ones when None (the API's
    no-op ones until an SDK is set up). Several managers may be instrumented with
    one provider; the in-flight gauge adds up managers of one queue.
    ``backlog_every``: count a worker's queues every so many seconds (a
    ``BacklogSampler``, stopped by ``uninstrument()``) for leasekeeper.queue.backlog.
    """
    if isinstance(target, (Worker, AsyncWorker)):
        manager, worker = target.manager, target
    elif isinstance(target, LeaseManager):
        manager, worker = target, None
    else:
        raise TypeError(
            "instrument() takes a LeaseManager, a Worker or an AsyncWorker, "
            f"got {type(target).__name__}"
        )
    if meter_provider is None:
        meter_provider = metrics.get_meter_provider()
    tracer = None
    if worker is not None:
        from leasekeeper import __version__

        tracer = trace.get_tracer(SCOPE, __version__, tracer_provider=tracer_provider)
    if backlog_every is not None and worker is None:
        raise TypeError("backlog_every counts a worker's queues: instrument a worker")
    handle = Instrumentation(manager, _instruments_for(meter_provider), worker, tracer)
    if backlog_every is not None:
        handle.sampler = BacklogSampler.of(worker, every=backlog_every).start()
    handle.start()
    return handle


@contextmanager
def _process(
    tracer: trace.Tracer,
    histogram: metrics.Histogram,
    message: Message,
    manager: LeaseManager | None,
) -> Iterator[None]:
    """One handler run: a CONSUMER span (exceptions recorded on it, status ERROR)
    and ``messaging.process.duration``, with ``error.type`` when it raised - or
    ``LeaseLost`` when it returned after its lease was lost (nothing is deleted)."""
    attributes = backend_attributes(message.backend)
    attributes[OPERATION_NAME] = "process"
    attributes[OPERATION_TYPE] = "process"
    start = time.perf_counter()
    # The producer's trace and baggage, carried in the message, for the span and the
    # handler both (attached, not only passed to the span: baggage lives there).
    token = context.attach(trace_context(message))
    try:
        with tracer.start_as_current_span(
            _process_span_name(attributes),
            kind=trace.SpanKind.CONSUMER,
            attributes={**attributes, MESSAGE_ID: message.id},
        ) as span:
            try:
                yield
            except BaseException as exc:
                attributes[ERROR_TYPE] = type(exc).__name__
                span.set_attribute(ERROR_TYPE, type(exc).__name__)
                raise
            lease = None if manager is None else manager.get(message)
            if manager is not None and (lease is None or lease.is_lost):
                attributes[ERROR_TYPE] = "LeaseLost"
                span.set_attribute(ERROR_TYPE, "LeaseLost")
                span.set_status(trace.Status(trace.StatusCode.ERROR, "lease lost while handling"))
    finally:
        context.detach(token)
        histogram.record(time.perf_counter() - start, attributes)

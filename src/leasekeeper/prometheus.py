"""Prometheus metrics of a LeaseManager: ``LeaseCollector``, read at scrape time.

``pip install 'leasekeeper[prometheus]'``. Nothing is registered on import: the
collector is yours to register, on ``prometheus_client.REGISTRY`` or a registry
of your own:

```python
from prometheus_client import REGISTRY
from leasekeeper.prometheus import LeaseCollector

REGISTRY.register(LeaseCollector(manager))
```

Each scrape takes one ``manager.stats()`` snapshot (a few milliseconds at most:
it sorts the last 2,048 timing samples of three kinds) and exposes, with the
default ``namespace="leasekeeper"``:

| metric | type | from ``Stats`` |
|---|---|---|
| leasekeeper_leases_in_flight | gauge | in_flight |
| leasekeeper_scheduler_running | gauge | ``manager.running`` (1 or 0) |
| leasekeeper_extend_threshold_seconds | gauge | extend_threshold (in force) |
| leasekeeper_leases_registered_total | counter | registered |
| leasekeeper_leases_ended_total{state} | counter | completed, released, lost, abandoned |
| leasekeeper_leases_capped_total | counter | capped (part of abandoned) |
| leasekeeper_leases_rolled_over_total | counter | rolled_over (jobs handed on before the cap) |
| leasekeeper_leases_lost_total{reason} | counter | lost_reasons (by ``LostReason``) |
| leasekeeper_extensions_total | counter | extended |
| leasekeeper_extend_calls_total | counter | extend_calls |
| leasekeeper_extend_errors_total | counter | extend_errors |
| leasekeeper_extend_retries_total | counter | retries |
| leasekeeper_lapses_total | counter | lapses |
| leasekeeper_margin_warnings_total | counter | margin_warnings |
| leasekeeper_callback_errors_total | counter | callback_errors |
| leasekeeper_scheduler_errors_total | counter | scheduler_errors |
| leasekeeper_scheduler_lag_seconds{quantile} | gauge | scheduler_lag_p50, _p99 |
| leasekeeper_send_lag_seconds{quantile} | gauge | send_lag_p50, _p99 |
| leasekeeper_extend_latency_seconds{quantile} | gauge | extend_latency_p50, _p99 |

Given a ``Worker`` or an ``AsyncWorker`` (``LeaseCollector(worker)``), it exposes its
manager's metrics and, per queue the worker reads (``queue``: the queue's name, as
``worker.stats.per_queue`` has it):

| metric | type | from |
|---|---|---|
| leasekeeper_worker_messages_total{queue,outcome} | counter | ``stats.per_queue`` (*) |
| leasekeeper_queue_leases_in_flight{queue} | gauge | the leases, by their queue |
| leasekeeper_queue_groups_waiting{queue} | gauge | ``stats.per_queue``: ``groups_waiting`` |
| leasekeeper_worker_busy_ratio | gauge | running handlers over ``concurrency`` |
| leasekeeper_queue_backlog_messages{queue} | gauge | a ``BacklogSampler``'s last count (**) |

(*) ``outcome``: received, completed, failed, lost, refused, rolled_over, dead_lettered,
held_back, interrupted. Nothing is labelled by message group: group ids are unbounded.
(**) Given ``backlog=`` (``leasekeeper.fleet.BacklogSampler``): the messages waiting
for a worker, as the service counted them at the sampler's last count - never asked
at scrape time.

``serve_metrics(manager_or_worker, port)`` serves them over HTTP on a registry of
their own; with ``backlog_every=S`` it counts a worker's queues every S seconds.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from leasekeeper.errors import install_hint

try:
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "leasekeeper.prometheus needs prometheus_client: " + install_hint("prometheus")
    ) from exc

from leasekeeper.aio.worker import AsyncWorker
from leasekeeper.fleet.autoscaling import BacklogSampler, busy_ratio
from leasekeeper.manager import LeaseManager, Stats
from leasekeeper.reasons import LostReason
from leasekeeper.receiving.stats import QueueStats
from leasekeeper.worker import Worker

__all__ = ["LeaseCollector", "MetricsServer", "serve_metrics"]

# (metric name without namespace or _total, Stats field, HELP)
_COUNTERS = (
    ("leases_registered", "registered", "Leases registered (messages the manager began to renew)."),
    ("extensions", "extended", "Successful extensions (one per lease per renewal)."),
    ("extend_calls", "extend_calls", "Extend calls sent to the queue service (a batch is one)."),
    (
        "extend_errors",
        "extend_errors",
        "Extend entries that came back retry or fatal, or calls that raised.",
    ),
    ("extend_retries", "retries", "Extends retried after a transient error."),
    (
        "lapses",
        "lapses",
        "Lease deadlines that passed before a successful extend was sent "
        "(another consumer may have received the message).",
    ),
    (
        "leases_capped",
        "capped",
        "Leases abandoned at the service's cap on total invisibility (also counted in "
        'leases_ended_total{state="abandoned"}).',
    ),
    (
        "leases_rolled_over",
        "rolled_over",
        "Jobs handed on to a continuation message before the service's cap (on_cap=rollover).",
    ),
    (
        "margin_warnings",
        "margin_warnings",
        "Times scheduler lag plus extend latency ate more than half of extend_threshold.",
    ),
    ("callback_errors", "callback_errors", "on_lost callbacks and observers that raised."),
    ("scheduler_errors", "scheduler_errors", "Unexpected errors the scheduler survived."),
)
_ENDED = ("completed", "released", "lost", "abandoned")
_TIMINGS = (
    (
        "scheduler_lag_seconds",
        "scheduler_lag",
        "How late the scheduler woke for the earliest due lease",
    ),
    (
        "send_lag_seconds",
        "send_lag",
        "Due time to extend sent, waiting for a dispatch thread included",
    ),
    ("extend_latency_seconds", "extend_latency", "Extend call latency"),
)


# Every count of QueueStats; groups_waiting is a gauge of its own.
_OUTCOMES = tuple(f.name for f in dataclasses.fields(QueueStats) if f.name != "groups_waiting")


class LeaseCollector(Collector):
    """A ``prometheus_client`` collector of one manager's ``stats()``, read at each
    scrape (see the module docstring for the metrics) - a worker's manager, and the
    worker's figures per queue, when given a ``Worker`` or ``AsyncWorker``.
    ``namespace`` prefixes every name; it must be a valid metric name prefix.
    ``backlog``: a ``BacklogSampler`` whose last counts are the backlog gauge."""

    def __init__(
        self,
        manager: LeaseManager | Worker | AsyncWorker,
        *,
        namespace: str = "leasekeeper",
        backlog: BacklogSampler | None = None,
    ) -> None:
        self.worker: Worker | AsyncWorker | None = None
        if isinstance(manager, (Worker, AsyncWorker)):
            self.worker, manager = manager, manager.manager
        if not isinstance(manager, LeaseManager):
            raise TypeError(
                f"LeaseCollector takes a LeaseManager or a worker, got {type(manager).__name__}"
            )
        if not namespace.replace("_", "a").isalnum() or namespace[0].isdigit():
            raise ValueError(f"namespace must be letters, digits and '_', got {namespace!r}")
        if backlog is not None and not isinstance(backlog, BacklogSampler):
            raise TypeError(f"backlog takes a BacklogSampler, got {type(backlog).__name__}")
        self.manager = manager
        self.namespace = namespace
        self.backlog = backlog

    def describe(self) -> Iterator[Metric]:
        """The metric families, without samples (so registering reads no stats)."""
        yield from self._families(None, running=False)
        if self.worker is not None:
            yield from self._queue_families(scraped=False)
        yield from self._scaling_families(scraped=False)

    def collect(self) -> Iterator[Metric]:
        yield from self._families(self.manager.stats(), running=self.manager.running)
        if self.worker is not None:
            yield from self._queue_families(scraped=True)
        yield from self._scaling_families(scraped=True)

    def _scaling_families(self, *, scraped: bool) -> Iterator[Metric]:
        """What an autoscaler reads: how busy the worker is, and the queues' backlog
        (as last counted: a scrape never waits for the service)."""
        ns = self.namespace
        if self.worker is not None:
            busy = GaugeMetricFamily(
                f"{ns}_worker_busy_ratio",
                "Handlers running over the worker's concurrency, 0 to 1.",
            )
            if scraped:
                busy.add_metric([], busy_ratio(self.worker))
            yield busy
        if self.backlog is not None:
            backlog = GaugeMetricFamily(
                f"{ns}_queue_backlog_messages",
                "Messages waiting for a worker, by queue: the service's count of visible "
                f"messages (Azure: all of them), counted every {self.backlog.every:g}s.",
                labels=["queue"],
            )
            if scraped:
                for name, count in self.backlog.backlog().items():
                    backlog.add_metric([name], count)
            yield backlog

    def _queue_families(self, *, scraped: bool) -> Iterator[Metric]:
        """The worker's figures per queue."""
        ns = self.namespace
        messages = CounterMetricFamily(
            f"{ns}_worker_messages",
            "Messages the worker received and how each ended, by queue and outcome "
            "(received, completed, failed, lost, refused, rolled_over, dead_lettered, "
            "held_back, interrupted).",
            labels=["queue", "outcome"],
        )
        in_flight = GaugeMetricFamily(
            f"{ns}_queue_leases_in_flight",
            "Leases held now, by the queue of their message.",
            labels=["queue"],
        )
        waiting = GaugeMetricFamily(
            f"{ns}_queue_groups_waiting",
            "Message groups of a FIFO queue waiting on an earlier message of theirs now, "
            "by queue (never by group).",
            labels=["queue"],
        )
        worker = self.worker
        if scraped and worker is not None:
            held: dict[int, int] = {}
            for lease in self.manager.leases():
                key = id(lease.message.backend)
                held[key] = held.get(key, 0) + 1
            for source in worker.intake.sources.all:
                for outcome in _OUTCOMES:
                    messages.add_metric([source.name, outcome], getattr(source.stats, outcome))
                in_flight.add_metric([source.name], held.get(id(source.backend), 0))
                waiting.add_metric([source.name], source.stats.groups_waiting)
        yield messages
        yield in_flight
        yield waiting

    def _families(self, stats: Stats | None, *, running: bool) -> Iterator[Metric]:
        ns = self.namespace
        in_flight = GaugeMetricFamily(
            f"{ns}_leases_in_flight",
            "Leases held now: registered and not yet completed, released, lost or abandoned.",
        )
        alive = GaugeMetricFamily(
            f"{ns}_scheduler_running",
            "1 while the manager renews leases (started, not closed, scheduler thread alive).",
        )
        threshold = GaugeMetricFamily(
            f"{ns}_extend_threshold_seconds",
            "The extend threshold in force: a lease is renewed when less than this "
            "remains (it moves with extend_threshold='auto').",
        )
        if stats is not None:
            in_flight.add_metric([], stats.in_flight)
            alive.add_metric([], 1.0 if running else 0.0)
            threshold.add_metric([], stats.extend_threshold)
        yield in_flight
        yield alive
        yield threshold
        ended = CounterMetricFamily(
            f"{ns}_leases_ended",
            "Leases that ended, by state: completed (deleted), released, lost, abandoned.",
            labels=["state"],
        )
        if stats is not None:
            for state in _ENDED:
                ended.add_metric([state], getattr(stats, state))
        yield ended
        lost = CounterMetricFamily(
            f"{ns}_leases_lost",
            "Leases lost or abandoned, by leasekeeper.LostReason (lapsed, rejected, ...).",
            labels=["reason"],
        )
        if stats is not None:
            for reason in LostReason:
                lost.add_metric([reason.value], stats.lost_reasons.get(reason.value, 0))
        yield lost
        for name, field, help_text in _COUNTERS:
            counter = CounterMetricFamily(f"{ns}_{name}", help_text)
            if stats is not None:
                counter.add_metric([], getattr(stats, field))
            yield counter
        for name, field, help_text in _TIMINGS:
            gauge = GaugeMetricFamily(
                f"{ns}_{name}",
                f"{help_text}: p50 and p99 of the last 2,048 samples, in seconds.",
                labels=["quantile"],
            )
            if stats is not None:
                gauge.add_metric(["0.5"], getattr(stats, field + "_p50"))
                gauge.add_metric(["0.99"], getattr(stats, field + "_p99"))
            yield gauge


@dataclass
class MetricsServer:
    """An HTTP server of ``/metrics`` started by ``serve_metrics``; ``close()`` stops it."""

    addr: str
    port: int  # the port bound (the one asked for, or the one chosen for port 0)
    registry: CollectorRegistry
    server: WSGIServer
    thread: threading.Thread
    #: The backlog counts it started (``backlog_every``), closed with it.
    sampler: BacklogSampler | None = None

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port (and stop counting the backlog)."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5.0)
        if self.sampler is not None:
            self.sampler.close()


def serve_metrics(
    collector_or_manager: LeaseCollector | LeaseManager | Worker | AsyncWorker,
    port: int,
    *,
    addr: str = "127.0.0.1",
    backlog_every: float | None = None,
) -> MetricsServer:
    """Serve ``collector_or_manager``'s metrics (a ``LeaseManager`` gets a
    ``LeaseCollector``) at ``http://addr:port/metrics`` from a daemon thread, on a
    registry of its own (nothing else of the process is exposed). ``port=0`` picks a
    free port (``server.port`` says which). Loopback only unless ``addr`` says
    otherwise. ``backlog_every``: given a worker, count its queues every so many
    seconds (a ``BacklogSampler``, stopped by ``close()``) for the backlog gauge."""
    target = collector_or_manager
    sampler: BacklogSampler | None = None
    if backlog_every is not None:
        if not isinstance(target, (Worker, AsyncWorker)):
            raise TypeError(
                "backlog_every counts a worker's queues: give serve_metrics() a worker "
                "(or a LeaseCollector its BacklogSampler)"
            )
        sampler = BacklogSampler.of(target, every=backlog_every)
    collector = (
        LeaseCollector(target, backlog=sampler)
        if isinstance(target, (LeaseManager, Worker, AsyncWorker))
        else target
    )
    if not isinstance(collector, LeaseCollector):
        raise TypeError(
            "serve_metrics() takes a LeaseCollector or a LeaseManager, got "
            f"{type(collector_or_manager).__name__}"
        )
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    server, thread = start_http_server(port, addr=addr, registry=registry)
    if sampler is not None:
        sampler.start()
    return MetricsServer(addr, int(server.server_port), registry, server, thread, sampler)

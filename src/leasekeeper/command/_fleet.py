"""``leasekeeper worker``'s flags for an elastic fleet, and what they make.

``--scale-in-protection`` (ECS), ``--health-port`` (Kubernetes' probes),
``--interruption-notice`` (spot and preemptible machines) and the flags that tune
them; ``command.worker`` adds them to its parser (``fleet_flags``), gives the worker
what ``worker_options`` makes of them, and serves the probes with ``serve_health``.
"""

from __future__ import annotations

import argparse
from typing import Any

from leasekeeper.command._options import number
from leasekeeper.command._usage import UsageError, one_line

__all__ = ["check_fleet_flags", "fleet_flags", "serve_health", "worker_options"]

NOTICES = ("aws", "azure", "alibaba")


def fleet_flags(p: argparse.ArgumentParser) -> None:
    fleet = p.add_argument_group("elastic fleets (ECS, Kubernetes, spot machines: docs/scaling.md)")
    fleet.add_argument(
        "--backlog-every",
        type=number(float, 0),
        default=30.0,
        metavar="S",
        help="with --metrics-port: count the queue's waiting messages every S seconds "
        "for leasekeeper_queue_backlog_messages, what an autoscaler reads (default: 30; "
        "0: never)",
    )
    fleet.add_argument(
        "--scale-in-protection",
        action="store_true",
        help="on ECS: protect the task from scale-in and deployments while the worker "
        "holds messages (through $ECS_AGENT_URI's task-protection endpoint), and remove "
        "the protection once it is idle, or at once on SIGTERM. Outside ECS it says so "
        "once; an agent that fails costs one warning, never the work",
    )
    fleet.add_argument(
        "--protection-minutes",
        type=number(int, 1),
        metavar="N",
        help="with --scale-in-protection: each protection's ExpiresInMinutes, 1 to 2880, "
        "renewed while the worker stays busy (default: 60)",
    )
    fleet.add_argument(
        "--health-port",
        type=number(int, 1),
        metavar="PORT",
        help="serve Kubernetes probes at http://ADDR:PORT: /livez (200 while the renewer "
        "keeps up) and /readyz (200 while receiving, 503 from the first SIGTERM on)",
    )
    fleet.add_argument(
        "--health-addr",
        default="0.0.0.0",
        metavar="ADDR",
        help="the address --health-port binds (default: 0.0.0.0, where the kubelet reaches it)",
    )
    fleet.add_argument(
        "--interruption-notice",
        choices=NOTICES,
        help="poll this cloud's metadata service every 2 s for a spot or preemption "
        "notice (aws: EC2 spot instance-action, with IMDSv2; azure: Scheduled Events "
        "Preempt and Terminate; alibaba: ECS spot termination-time); on one, drain as "
        "on SIGTERM, with the notice's time as the deadline, and exit 0",
    )
    fleet.add_argument(
        "--interruption-margin",
        type=number(float, 0),
        metavar="S",
        help="with --interruption-notice: release what has not finished S seconds "
        "before the machine goes (default: 10)",
    )
    fleet.add_argument(
        "--metadata-endpoint",
        metavar="URL",
        help="with --interruption-notice: the metadata service's address (default: the "
        "cloud's own; for aws, AWS_EC2_METADATA_SERVICE_ENDPOINT as botocore reads it)",
    )


def check_fleet_flags(args: argparse.Namespace) -> None:
    """The tuning flags need the flag they tune: a UsageError naming both."""
    needs = (  # (the flag, the flag it tunes)
        ("--protection-minutes", "--scale-in-protection"),
        ("--interruption-margin", "--interruption-notice"),
        ("--metadata-endpoint", "--interruption-notice"),
    )
    for flag, needed in needs:
        given = getattr(args, flag[2:].replace("-", "_"), None)
        if given is not None and not getattr(args, needed[2:].replace("-", "_"), None):
            raise UsageError(f"{flag} needs {needed}")
    minutes = getattr(args, "protection_minutes", None)
    if minutes is not None and minutes > 2880:
        raise UsageError(
            f"--protection-minutes is ECS's ExpiresInMinutes: 1 to 2880, got {minutes}"
        )


def worker_options(args: argparse.Namespace) -> dict[str, Any]:
    """``scale_in_protection`` and ``interruption_notice`` for the worker, from the flags."""
    options: dict[str, Any] = {}
    if getattr(args, "scale_in_protection", False):
        from leasekeeper.fleet import ScaleInProtection

        options["scale_in_protection"] = ScaleInProtection(minutes=args.protection_minutes or 60)
    if getattr(args, "interruption_notice", None):
        from leasekeeper.fleet import InterruptionWatch
        from leasekeeper.fleet.notices import notice_source

        source = notice_source(args.interruption_notice, args.metadata_endpoint)
        margin = 10.0 if args.interruption_margin is None else args.interruption_margin
        options["interruption_notice"] = InterruptionWatch(source, margin=margin)
    return options


def serve_health(args: argparse.Namespace, worker: Any) -> Any:
    """The probes ``--health-port`` asks for (None without it); a UsageError when the
    port cannot be bound."""
    if getattr(args, "health_port", None) is None:
        return None
    from leasekeeper.fleet import serve_probes

    try:
        return serve_probes(worker, args.health_port, addr=args.health_addr)
    except OSError as exc:
        raise UsageError(
            f"cannot serve probes on {args.health_addr}:{args.health_port}: {one_line(exc)}"
        ) from exc

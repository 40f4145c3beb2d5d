"""extend_threshold="auto": the margin follows the measured lateness, within bounds."""

from __future__ import annotations

import pytest

from leasekeeper import ConfigError, LeaseConfig, LeaseManager, LeaseState
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import Faults, FaultyBackend, ManualClock


def one_lease_for_an_hour(threshold: object, latency: float = 0.0) -> tuple[int, float]:
    """Extensions of one lease over an hour, and the threshold in force at the end."""
    clock = ManualClock()
    queue = MemoryQueue(30, clock=clock, rotate_receipts=True)
    backend = FaultyBackend(queue, seed=1, clock=clock, extend=Faults(latency=latency))
    manager = LeaseManager(backend, clock=clock, visibility_timeout=30, extend_threshold=threshold)
    queue.send("job")
    lease = manager.register(backend.receive()[0])
    clock.advance(3600)
    assert lease.state is LeaseState.ACTIVE, lease.reason
    stats = manager.stats()
    manager.close(release=False)
    return lease.extensions, stats.extend_threshold


def test_a_fast_service_gets_fewer_calls() -> None:
    static, static_threshold = one_lease_for_an_hour(None)
    auto, auto_threshold = one_lease_for_an_hour("auto")
    assert static_threshold == 10.0  # the derived default: a third of 30 s
    # Nothing was late and calls took no time: the floor, timer_interval + minimal_life.
    assert auto_threshold == pytest.approx(3.0)
    assert static == 3600 // 20
    assert auto < static * 0.85


def test_a_slow_service_gets_earlier_renewals() -> None:
    # Every extend takes 6 s: the auto margin grows to cover 3x that lateness.
    static, static_threshold = one_lease_for_an_hour(None, latency=6.0)
    auto, auto_threshold = one_lease_for_an_hour("auto", latency=6.0)
    assert static_threshold == 10.0
    assert auto_threshold == pytest.approx(min(24.0, 1.0 + 3 * 6.0))
    assert auto > static  # more calls: the price of the margin


def test_the_auto_threshold_never_passes_its_cap() -> None:
    _, threshold = one_lease_for_an_hour("auto", latency=12.0)
    assert threshold == pytest.approx(0.8 * 30)


def test_auto_is_a_valid_setting_and_nonsense_is_not() -> None:
    config = LeaseConfig(extend_threshold="auto")
    assert config.adaptive and config.threshold == 10.0
    assert config.threshold_bounds == (3.0, 24.0)
    with pytest.raises(ConfigError):
        LeaseConfig(extend_threshold="sometimes")  # type: ignore[arg-type]

"""LeaseConfig validation: every bad value says which parameter, its value and the rule."""

from __future__ import annotations

import math

import pytest

from leasekeeper import ConfigError, LeaseConfig, LeaseManager
from leasekeeper.backends.memory import MemoryQueue


def test_defaults_are_valid_and_threshold_is_derived() -> None:
    config = LeaseConfig()
    assert config.visibility_timeout == 30.0
    assert config.threshold == 10.0  # max(1 + 2, 30 / 3)
    assert LeaseConfig(visibility_timeout=6, timer_interval=1, minimal_life=2).threshold == 3.0
    assert LeaseConfig(extend_threshold=5).threshold == 5.0


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_visibility_must_exceed_timer_plus_minimal_life() -> None:
    with pytest.raises(ConfigError) as raised:
        LeaseConfig(visibility_timeout=4.0, timer_interval=1.0, minimal_life=5.0)
    assert str(raised.value) == (
        "visibility_timeout (4) must exceed timer_interval (1) + minimal_life (5)"
    )
    with pytest.raises(ConfigError, match=r"visibility_timeout \(3\)"):
        LeaseConfig(visibility_timeout=3.0, timer_interval=1.0, minimal_life=2.0)


@pytest.mark.parametrize(
    ("threshold", "rule"),
    [
        (1.0, "must exceed timer_interval"),
        (0.5, "must exceed timer_interval"),
        (30.0, "less than visibility_timeout"),
        (45.0, "less than visibility_timeout"),
    ],
)
def test_threshold_must_lie_between_timer_and_visibility(threshold: float, rule: str) -> None:
    with pytest.raises(ConfigError, match=rule) as raised:
        LeaseConfig(extend_threshold=threshold)
    assert f"extend_threshold ({threshold:g})" in str(raised.value)


@pytest.mark.parametrize(
    "field",
    [
        "visibility_timeout",
        "timer_interval",
        "minimal_life",
        "max_lease_duration",
        "extend_threshold",
    ],
)
@pytest.mark.parametrize("bad", [-1, 0, math.nan, math.inf, -math.inf, "30", None, True, [1]])
def test_bad_durations_are_rejected_with_the_field_name(field: str, bad: object) -> None:
    if bad is None and field in ("max_lease_duration", "extend_threshold"):
        return  # None is their documented "not set"
    with pytest.raises(ConfigError, match=field):
        LeaseConfig(**{field: bad})  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, "0"])
def test_bad_release_delay(bad: object) -> None:
    with pytest.raises(ConfigError, match="release_delay"):
        LeaseConfig(release_delay=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -3, 1.5, "8", True])
def test_bad_max_concurrency(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_concurrency"):
        LeaseConfig(max_concurrency=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0.5, math.nan, math.inf, "2"])
def test_bad_release_backoff(bad: object) -> None:
    with pytest.raises(ConfigError, match="release_backoff"):
        LeaseConfig(release_backoff=bad)  # type: ignore[arg-type]


def test_ints_are_accepted_as_seconds() -> None:
    config = LeaseConfig(visibility_timeout=60, timer_interval=2, minimal_life=5)
    assert isinstance(config.visibility_timeout, float)


def test_visibility_above_the_backends_maximum_is_rejected() -> None:
    queue = MemoryQueue(10, max_visibility=100)
    with pytest.raises(
        ConfigError,
        match=r"visibility_timeout \(200\) exceeds the backend's "
        r"max_visibility \(100\)",
    ):
        LeaseManager(queue, visibility_timeout=200)


def test_manager_keyword_fields_and_unknown_names() -> None:
    manager = LeaseManager(visibility_timeout=60, timer_interval=2)
    assert manager.config == LeaseConfig(visibility_timeout=60, timer_interval=2)
    with pytest.raises(ConfigError, match=r"unknown LeaseConfig field.*visibilty_timeout"):
        LeaseManager(visibilty_timeout=60)
    base = LeaseConfig(visibility_timeout=60)
    assert LeaseManager(config=base, release_delay=3).config.release_delay == 3
    with pytest.raises(ConfigError, match="must be a LeaseConfig"):
        LeaseManager(config={"visibility_timeout": 60})  # type: ignore[arg-type]


def test_config_is_immutable() -> None:
    config = LeaseConfig()
    with pytest.raises(AttributeError):
        config.visibility_timeout = 5  # type: ignore[misc]

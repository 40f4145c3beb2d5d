"""Source specs: picklable, secret-free, validated (no Spark session needed)."""

from __future__ import annotations

import pickle

import pytest

from leasekeeper.spark import AzureQueueSource, MNSSource, SQSSource, _check_args


def test_sources_pickle_round_trip() -> None:
    for source in (
        SQSSource("https://sqs.us-east-1.amazonaws.com/1/q", region="us-east-1"),
        MNSSource("http://127.0.0.1:9999", "jobs"),
        AzureQueueSource("jobs"),
    ):
        assert pickle.loads(pickle.dumps(source)) == source


def test_azure_source_refuses_a_connection_string_with_a_key() -> None:
    conn = "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=c2VjcmV0;QueueEndpoint=x"
    with pytest.raises(ValueError, match="executors' environment") as raised:
        AzureQueueSource("jobs", connection_string=conn)
    assert "c2VjcmV0" not in str(raised.value)
    keyless = AzureQueueSource("jobs", connection_string="UseDevelopmentStorage=true")
    assert "UseDevelopmentStorage" not in repr(keyless)
    with pytest.raises(ValueError, match="not both"):
        AzureQueueSource("jobs", connection_string="UseDevelopmentStorage=true", account_url="x")


def test_mns_source_needs_credentials_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MNS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("MNS_ACCESS_KEY_SECRET", raising=False)
    with pytest.raises(Exception, match="MNS_ACCESS_KEY_ID"):
        MNSSource("http://127.0.0.1:1", "q").build()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 10, 10, 5.0, None), "partitions"),
        ((2, 0, 10, 5.0, None), "batch_size"),
        ((2, 10, -1, 5.0, None), "concurrency"),
        ((2, 10, 10, 0.0, None), "idle_seconds"),
        ((2, 10, 10, float("nan"), None), "idle_seconds"),
        ((2, 10, 10, 5.0, 0), "max_messages"),
    ],
)
def test_drain_arguments_are_checked(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _check_args(*args)  # type: ignore[arg-type]

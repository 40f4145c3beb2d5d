"""The renewer process of an SQS worker on the lean path: with fixed keys it renews
without importing botocore (``scheme.sqs``'s ``defer_client``: the client is made
only when a call needs it), with the same outcomes and retries as the client's
path; credentials that refresh keep the client, made in that process as before."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from botocore.credentials import RefreshableCredentials

from leasekeeper.backends.contract import Handle
from leasekeeper.backends.spec import connect, renewal_spec
from leasekeeper.backends.sqs import SQSBackend
from tests.services import make_client
from tests.sqs.scripted import ScriptedSQS
from tests.sqs.stubbed import REGION, handles

UNAVAILABLE = {"code": "ServiceUnavailable", "query_code": "ServiceUnavailable", "message": ""}
SDK = ("botocore", "boto3", "urllib3")

# What the renewer process does with its worker's spec: build its manager, renew and
# delete the lease the worker holds, tell what it imported of the SDK (and whether
# it read the installed packages' metadata to find the factory: the worker did; or
# multiprocessing, whose connection module its socket's end does without).
RENEWER = textwrap.dedent(
    """
    import pickle, sys
    from leasekeeper.backends.contract import Handle
    from leasekeeper.renewers._main import build_manager

    spec, message_id, receipt = pickle.loads(sys.stdin.buffer.read())
    manager = build_manager(spec, None)
    [backend] = manager.queues
    handle = Handle(message_id, receipt)
    print([outcome.kind for outcome in backend.extend([handle], 60)])
    print([outcome.kind for outcome in backend.delete([handle])])
    print(sorted(m for m in sys.modules if m.split(".")[0] in {sdk!r} or m == {metadata!r}))
    """
).format(sdk=(*SDK, "multiprocessing"), metadata="importlib.metadata")


def run_renewer(spec: Any, message_id: str, receipt: str, **env: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", RENEWER],
        env={**os.environ, **env},
        input=pickle.dumps((spec, message_id, receipt)),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode().splitlines()


def test_the_renewer_of_a_client_with_fixed_keys_renews_without_botocore(
    moto_endpoint: str, make_queue: Any
) -> None:
    url = make_queue(visibility_timeout=30)
    client = make_client(moto_endpoint)  # keys given in code
    client.send_message(QueueUrl=url, MessageBody="job")
    [message] = client.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"]
    backend = SQSBackend(client, url)
    spec = renewal_spec(backend)
    assert "defer_client" in repr(spec)  # (names only: the keys travel, never shown)
    extended, deleted, imported = run_renewer(spec, message["MessageId"], message["ReceiptHandle"])
    assert (extended, deleted, imported) == ("['ok']", "['ok']", "[]")
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "0"
    assert attributes["ApproximateNumberOfMessages"] == "0"


def test_refreshing_credentials_keep_the_client_in_the_renewer(
    moto_endpoint: str, make_queue: Any
) -> None:
    url = make_queue(visibility_timeout=30)
    client = make_client(moto_endpoint)
    refreshing = RefreshableCredentials.create_from_metadata(
        {
            "access_key": "testing",
            "secret_key": "testing",
            "token": "",
            "expiry_time": "2999-01-01T00:00:00Z",
        },
        refresh_using=lambda: {},
        method="env",  # one the renewer's own chain finds again
    )
    client._request_signer._credentials = refreshing
    client.send_message(QueueUrl=url, MessageBody="job")
    [message] = client.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"]
    spec = renewal_spec(SQSBackend(client, url))
    assert "defer_client" not in repr(spec)
    # The renewer finds the environment's keys through botocore, as before.
    keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    extended, deleted, imported = run_renewer(
        spec, message["MessageId"], message["ReceiptHandle"], **keys
    )
    assert (extended, deleted) == ("['ok']", "['ok']")
    assert "botocore" in imported


def deferred(url: str, **options: Any) -> SQSBackend:
    backend = connect(
        f"{url}/123456789012/jobs",
        endpoint_url=url,
        region=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        retry_mode="standard",
        max_attempts=3,
        defer_client=True,
        **options,
    )
    assert isinstance(backend, SQSBackend)
    return backend


@pytest.mark.parametrize("client_retries", [False, True])
def test_a_deferred_client_fails_and_retries_as_the_client_would(
    client_retries: bool,
) -> None:
    with ScriptedSQS() as script:
        lean = deferred(script.url, client_retries=client_retries)
        assert type(lean.client).__name__ == "DeferredClient"
        assert lean.lean is not None
        lean.lean.sleep = lambda seconds: None
        made = SQSBackend(
            make_client(script.url, retries={"total_max_attempts": 3, "mode": "standard"}),
            f"{script.url}/123456789012/jobs",
            client_retries=client_retries,
        )
        assert made.lean is not None
        made.lean.sleep = lambda seconds: None
        attempts = 3 if client_retries else 1  # leasekeeper's own calls: one, else botocore's
        outcomes = []
        for backend in (lean, made):
            for _ in range(attempts):
                script.error("ChangeMessageVisibilityBatch", status=503, **UNAVAILABLE)
            outcomes.append(backend.extend(handles(1), 30))
            assert script.pending() == 0
        assert outcomes[0] == outcomes[1]
        [outcome] = outcomes[0]
        assert outcome.kind == "retry" and "ServiceUnavailable" in outcome.detail
        # An error answer is read by botocore's own parser, on the client's model.
        assert "made=True" in repr(lean.client)


def test_a_call_the_lean_path_does_not_make_makes_the_client() -> None:
    with ScriptedSQS() as script:
        backend = deferred(script.url)
        script.answer("ChangeMessageVisibilityBatch", {"Successful": [{"Id": "0"}], "Failed": []})
        assert [o.kind for o in backend.extend([Handle("id", "r" * 40)], 30)] == ["ok"]
        assert "made=False" in repr(backend.client)
        script.answer("GetQueueAttributes", {"Attributes": {"VisibilityTimeout": "45"}})
        assert backend.queue_visibility_timeout() == 45.0
        assert "made=True" in repr(backend.client)

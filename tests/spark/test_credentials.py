"""Credentials on executors: a spec carries none, and a process without them fails
with an error that names what to set and where (no Spark session needed; the
cluster test in test_worker_loss.py shows the same on real executors)."""

from __future__ import annotations

import pickle
import sys
from typing import Any

import pytest

from leasekeeper.backends.azure import AzureQueueBackend, AzureQueueSpec
from leasekeeper.backends.mns import MNSBackend, MNSSpec
from leasekeeper.backends.sqs import SQSBackend, SQSSpec
from leasekeeper.errors import ConfigError, ReceiveError
from leasekeeper.spark.sources import source_from_options, source_options

AWS_KEY_ID, AWS_SECRET = "AKIAEXAMPLEKEYID0001", "aws/secret+value/0123456789abcdefEXAMPLE"
MNS_KEY = "mns-secret-value-0123456789"
AZURE_KEY = "YXp1cmUtYWNjb3VudC1rZXktMDEyMzQ1Njc4OWFiY2RlZg=="


@pytest.fixture
def bare_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """This process as an executor whose environment has the region and nothing else
    of AWS, MNS or Azure (no keys, no profile, no metadata service)."""
    import os

    import boto3

    # A fresh executor has no default boto3 session yet; this process may have one,
    # and it keeps the credentials it resolved from an earlier test's environment.
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    for name in list(os.environ):
        if name.startswith(("AWS_", "MNS_", "AZURE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))


def secret_free(spec: object, *secrets: str) -> None:
    """Neither the pickle Spark ships nor the options nor the repr hold a secret."""
    from pyspark import cloudpickle  # what PySpark pickles closures with

    shipped = [pickle.dumps(spec), cloudpickle.dumps(spec), repr(spec).encode()]
    shipped.append(repr(source_options(spec)).encode())
    for secret in secrets:
        assert not any(secret.encode() in blob for blob in shipped), secret


def test_a_spec_of_a_backend_with_keys_carries_none(moto_endpoint: str) -> None:
    """``backend.spec()`` of a backend whose client holds keys: what Spark pickles into
    every task names the queue, never the keys (nor do its options or repr)."""
    import boto3
    from azure.storage.queue import QueueClient
    from mns.account import Account

    client = boto3.client(
        "sqs",
        region_name="eu-west-1",
        endpoint_url=moto_endpoint,
        aws_access_key_id=AWS_KEY_ID,
        aws_secret_access_key=AWS_SECRET,
    )
    url = f"{moto_endpoint}/123456789012/jobs"
    sqs = SQSBackend(client, url).spec()
    assert url in repr(sqs) and "eu-west-1" in repr(sqs)
    secret_free(sqs, AWS_KEY_ID, AWS_SECRET)

    mns = MNSBackend(Account("http://127.0.0.1:1", "mns-id", MNS_KEY).get_queue("jobs")).spec()
    secret_free(mns, MNS_KEY)

    conn = (
        "DefaultEndpointsProtocol=http;AccountName=acct;"
        f"AccountKey={AZURE_KEY};QueueEndpoint=http://127.0.0.1:1/acct"
    )
    azure = AzureQueueBackend(QueueClient.from_connection_string(conn, "jobs")).spec()
    secret_free(azure, AZURE_KEY)
    # The older spec classes (SQSSource...) hold no secret either; a connection
    # string with a key is refused outright (test_stream_options.py).
    secret_free(SQSSpec(url, "eu-west-1", moto_endpoint), AWS_KEY_ID)
    for spec in (sqs, mns, azure):
        # read_stream's string options give back the same secret-free spec.
        assert source_from_options(source_options(spec)) == spec


def test_no_aws_keys_names_the_variables_and_where_they_go(
    bare_environment: None, moto_endpoint: str, make_queue: Any
) -> None:
    url = make_queue(30)
    backend = SQSSpec(url, endpoint_url=moto_endpoint).build()  # the region: environment
    with pytest.raises(ReceiveError) as raised:
        backend.receive(max_messages=10, visibility_timeout=30)
    text = str(raised.value)
    assert not raised.value.retryable
    assert "NoCredentialsError" in text and "AWS_ACCESS_KEY_ID" in text
    assert "spark.executorEnv.AWS_ACCESS_KEY_ID" in text and "AWS_SECRET_ACCESS_KEY" in text


def test_no_aws_region_names_the_variable(
    bare_environment: None, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    spec = SQSSpec(f"{moto_endpoint}/123456789012/jobs", endpoint_url=moto_endpoint)
    with pytest.raises(ConfigError, match="NoRegionError: no AWS region") as raised:
        spec.build()
    text = str(raised.value)
    assert "AWS_DEFAULT_REGION" in text and "AWS_REGION" in text and "region=" in text
    # AWS_REGION, which boto3 alone does not read, is a region too.
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert spec.build().client.meta.region_name == "eu-west-1"


def test_no_mns_keys_names_the_variables(bare_environment: None) -> None:
    with pytest.raises(ConfigError) as raised:
        MNSSpec("http://127.0.0.1:1", "jobs").build()
    text = str(raised.value)
    assert "MNS_ACCESS_KEY_ID" in text and "MNS_ACCESS_KEY_SECRET" in text
    assert "spark.executorEnv.MNS_ACCESS_KEY_ID" in text


def test_no_azure_credential_names_the_variables(
    bare_environment: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError) as raised:
        AzureQueueSpec("jobs").build()
    assert "spark.executorEnv.AZURE_STORAGE_CONNECTION_STRING" in str(raised.value)
    # An account URL and no key, SAS token or connection string: azure-identity's
    # DefaultAzureCredential would be next; without azure-identity, say what to set.
    monkeypatch.setitem(sys.modules, "azure.identity", None)  # import fails
    with pytest.raises(ConfigError) as raised:
        AzureQueueSpec("jobs", account_url="https://acct.queue.core.windows.net").build()
    text = str(raised.value)
    assert "AZURE_STORAGE_SAS_TOKEN" in text and "AZURE_STORAGE_ACCOUNT_KEY" in text
    assert "azure-identity" in text

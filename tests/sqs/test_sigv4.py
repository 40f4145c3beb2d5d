"""The lean path's own SigV4 signer (backends/sqs/sigv4.py) signs as botocore's
SigV4Auth does: the same headers and Authorization on a fixed time and fixed
credentials, with and without a session token, on http and https endpoints with
and without a port and a path, and a new key when the secret or the day changes."""

from __future__ import annotations

import datetime
from unittest import mock

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.utils import normalize_url_path

from leasekeeper.backends.sqs.sigv4 import RequestSigner, normalized_path

CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET = "AmazonSQS.ReceiveMessage"
BODY = b'{"QueueUrl":"http://localhost/123456789012/q","MaxNumberOfMessages":10}'
NOW = datetime.datetime(2026, 11, 27, 21, 37, 5)


def botocores(
    url: str, credentials: Credentials, body: bytes, now: datetime.datetime
) -> dict[str, str]:
    headers = {"Content-Type": CONTENT_TYPE, "X-Amz-Target": TARGET, "x-amzn-query-mode": "true"}
    request = AWSRequest(method="POST", url=url, data=body, headers=headers)
    with mock.patch("botocore.auth.get_current_datetime", return_value=now):
        SigV4Auth(credentials.get_frozen_credentials(), "sqs", "eu-west-1").add_auth(request)
    return dict(request.headers.items())


def ours(
    signer: RequestSigner, credentials: Credentials, body: bytes, now: datetime.datetime
) -> dict[str, str]:
    signer.clock = lambda: now.replace(tzinfo=datetime.timezone.utc).timestamp()
    return signer.headers(credentials.get_frozen_credentials(), TARGET, CONTENT_TYPE, body)


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:4566",
        "https://sqs.eu-west-1.amazonaws.com",
        "https://sqs.eu-west-1.amazonaws.com:443/",
        "http://127.0.0.1:80/some/path",
        "https://vpce-1.sqs.eu-west-1.vpce.amazonaws.com:8443",
        "http://[::1]:4566",
        "http://LocalHost:80",
    ],
)
@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzE token/with+odd=chars"])
def test_the_signature_is_botocores(url: str, token: str | None) -> None:
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    signer = RequestSigner(url, "eu-west-1", "sqs")
    assert ours(signer, credentials, BODY, NOW) == botocores(url, credentials, BODY, NOW)
    assert ours(signer, credentials, b"", NOW) == botocores(url, credentials, b"", NOW)


def test_a_new_secret_or_a_new_day_signs_with_a_new_key() -> None:
    url = "https://sqs.eu-west-1.amazonaws.com"
    signer = RequestSigner(url, "eu-west-1", "sqs")
    first = Credentials("AKID1", "secret-one")
    assert ours(signer, first, BODY, NOW) == botocores(url, first, BODY, NOW)
    rotated = Credentials("AKID2", "secret-two", "token")
    assert ours(signer, rotated, BODY, NOW) == botocores(url, rotated, BODY, NOW)
    tomorrow = NOW + datetime.timedelta(days=1)
    assert ours(signer, rotated, BODY, tomorrow) == botocores(url, rotated, BODY, tomorrow)
    assert ours(signer, first, BODY, tomorrow) == botocores(url, first, BODY, tomorrow)


@pytest.mark.parametrize(
    "path", ["/", "/123456789012/jobs", "/a//b/", "/a/./b/../c", "/..", "/a/b/", "/~x/%20y"]
)
def test_the_path_is_normalised_as_botocore_signs_it(path: str) -> None:
    """The signer's own path normalisation (it imports nothing of botocore's) is
    botocore's: the signature covers the same canonical path."""
    assert normalized_path(path) == normalize_url_path(path)

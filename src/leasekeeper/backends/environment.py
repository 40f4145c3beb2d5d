"""What to tell a process that cannot reach its queue service: missing credentials or
region, by name, and where they are set (``leasekeeper.backends.sqs.credentials``
says it for AWS with these words).

A backend built from a spec (a Spark executor, the renewer process) takes its
credentials from its own environment, never from the spec. When they are not
there, the SDK's own words ("Unable to locate credentials") name neither the
variables nor the place they go on a cluster. The backends call these
functions for their error texts. No text here quotes a credential: only the
names of variables, profiles and settings.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence

AZURE_CONNECTION = "AZURE_STORAGE_CONNECTION_STRING"
AZURE_CREDENTIALS = ("AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_ACCOUNT_KEY", AZURE_CONNECTION)


def _names(variables: Sequence[str], joiner: str) -> str:
    if len(variables) == 1:
        return variables[0]
    return f"{', '.join(variables[:-1])} {joiner} {variables[-1]}"


def on_spark(variables: Sequence[str], joiner: str = "and") -> str:
    """Where ``variables`` go on a Spark cluster: the executors' environment (drain)
    through spark.executorEnv.*, the driver's own for read_stream's reader."""
    settings = [f"spark.executorEnv.{name}" for name in variables]
    return (
        f"on a Spark cluster: {_names(settings, joiner)} for the executors, "
        "the driver's environment for read_stream's reader"
    )


def in_spark() -> bool:
    """This process runs Spark (a driver or an executor's Python worker)."""
    return "pyspark" in sys.modules


def missing_variables(what: str, variables: Sequence[str], *, joiner: str = "and") -> str:
    """``what`` is missing: set ``variables`` in this process's environment (and, in
    a process that runs Spark, in the executors' through spark.executorEnv.*)."""
    where = f" ({on_spark(variables, joiner)})" if in_spark() else ""
    return f"{what}: set {_names(variables, joiner)} in this process's environment{where}"


MNS_KEYS = ("MNS_ACCESS_KEY_ID", "MNS_ACCESS_KEY_SECRET")


def mns_no_credentials() -> str:
    """MNS_ACCESS_KEY_ID or MNS_ACCESS_KEY_SECRET is not set in this process."""
    where = " (on a Spark cluster: spark.executorEnv.MNS_ACCESS_KEY_ID etc.)" if in_spark() else ""
    return (
        "an MNS queue is opened with MNS_ACCESS_KEY_ID and MNS_ACCESS_KEY_SECRET from "
        f"the environment, or keys given in code, and they are not set here{where}"
    )


def mns_credentials_problem() -> str | None:
    """Why an MNS queue opened from this process's environment would have no keys."""
    if all(os.environ.get(name) for name in MNS_KEYS):
        return None
    return f"ConfigError: {mns_no_credentials()}"


def azure_no_credential(account_url: str) -> str:
    """No key, SAS token or connection string here, and no azure-identity to try."""
    return (
        missing_variables(
            f"no credential for {account_url} in this process", AZURE_CREDENTIALS, joiner="or"
        )
        + ", or install azure-identity to use a managed identity (DefaultAzureCredential)"
    )


def azure_credentials_problem(account_url: str) -> str | None:
    """Why an Azure queue opened from this process's environment would have no
    credential (``schemes.azure``'s order: a connection string, a SAS token or account key,
    else azure-identity), or None."""
    if any(os.environ.get(name) for name in AZURE_CREDENTIALS):
        return None
    if importlib.util.find_spec("azure.identity") is not None:
        return None  # DefaultAzureCredential: what it finds is known at the first call
    return f"ConfigError: {azure_no_credential(account_url)}"


def azure_default_credential(account_url: str) -> object:
    """azure-identity's DefaultAzureCredential (managed identity, environment, CLI...),
    for an account URL with no key, SAS token or connection string in the
    environment; a ConfigError naming those when azure-identity is not installed."""
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        from leasekeeper.errors import ConfigError

        raise ConfigError(azure_no_credential(account_url)) from None
    return DefaultAzureCredential()

"""An SQS client the user built, read so another process can build it again: the
``leasekeeper.backends.rebuild`` part of SQS (see there). ``sqs_settings`` are the
factory options that make a client like it (``backend.spec()`` carries them),
``sqs_secrets`` what only the renewer process is given (keys given in code, a
proxy's password), ``sqs_credentials_problem`` why another process could not
have its credentials. Reads botocore's objects through their attributes (it
imports none of botocore until a question needs its session).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from leasekeeper.backends.rebuild import (
    CLIENT_KEY,
    PROXY_CLIENT_KEY,
    PROXY_SETTINGS,
    certificate_options,
    proxy_options,
)
from leasekeeper.backends.sqs.credentials import aws_configuration, aws_credentials_problem
from leasekeeper.backends.urls import redact_url

__all__ = ["sqs_credentials_problem", "sqs_secrets", "sqs_settings", "sqs_verify"]

# Where botocore's own chain finds credentials: the renewer process, on this
# machine with this environment, finds refreshing ones of these kinds itself.
_AWS_CHAIN_METHODS = frozenset(
    {
        "env",
        "shared-credentials-file",
        "config-file",
        "assume-role",
        "assume-role-with-web-identity",
        "sso",
        "iam-role",
        "container-role",
        "custom-process",
        "boto-config",
        "ec2-credentials-file",
    }
)


def sqs_settings(client: Any) -> dict[str, Any]:
    """The factory options (``leasekeeper.backends.sqs.scheme.sqs``) that make a client
    like ``client``: endpoint, region, retry mode and attempts, timeouts, pool
    size, the User-Agent's extra and app id, TLS verification and client
    certificate, proxies and their TLS settings.
    The proxies keep their password: a spec drops it (``public_options``),
    ``sqs_secrets`` sends it to the renewer process."""
    meta = getattr(client, "meta", None)
    config = getattr(meta, "config", None)
    retries = getattr(config, "retries", None)
    retries = retries if isinstance(retries, Mapping) else {}
    return {
        "region": getattr(meta, "region_name", None),
        "endpoint_url": getattr(meta, "endpoint_url", None),
        "retry_mode": retries.get("mode"),
        "max_attempts": retries.get("total_max_attempts"),
        "connect_timeout": getattr(config, "connect_timeout", None),
        "read_timeout": getattr(config, "read_timeout", None),
        "max_pool_connections": getattr(config, "max_pool_connections", None),
        "user_agent_extra": getattr(config, "user_agent_extra", None),
        "user_agent_appid": getattr(config, "user_agent_appid", None),
        "verify": _verify_setting(client),
        **proxy_options(getattr(config, "proxies", None)),
        **_proxy_settings(getattr(config, "proxies_config", None)),
        **certificate_options(getattr(config, "client_cert", None), "client_cert", CLIENT_KEY),
    }


def _proxy_settings(proxies_config: object) -> dict[str, Any]:
    """The factory options of botocore's ``proxies_config``: a TLS proxy's CA bundle
    and client certificate (a (certificate, key) pair as two options), forwarding."""
    if not isinstance(proxies_config, Mapping):
        return {}
    settings = {name: proxies_config.get(name) for name in PROXY_SETTINGS}
    cert = settings.pop("proxy_client_cert")
    return {**settings, **certificate_options(cert, "proxy_client_cert", PROXY_CLIENT_KEY)}


def sqs_verify(client: Any) -> bool | str:
    """``client``'s TLS verification: False, True, or the CA bundle's path (botocore
    keeps it on the client's HTTP session)."""
    endpoint = getattr(client, "_endpoint", None)
    verify = getattr(getattr(endpoint, "http_session", None), "_verify", True)
    return verify if isinstance(verify, (bool, str)) else True


def _verify_setting(client: Any) -> bool | str | None:
    """The ``verify`` another process must be given to make ``client``'s calls: False,
    or a CA bundle other than the one its own configuration names (``AWS_CA_BUNDLE``,
    the config file's ``ca_bundle``, which it reads itself); None when it needs none
    (an ``http`` endpoint's client too)."""
    endpoint = str(getattr(getattr(client, "meta", None), "endpoint_url", ""))
    if not endpoint.startswith("https:"):
        return None
    verify = sqs_verify(client)
    if verify is False or not isinstance(verify, str):
        return False if verify is False else None
    import botocore.session

    own = botocore.session.get_session().get_config_variable("ca_bundle")
    return None if own == verify else verify


def _aws_credentials(client: Any) -> Any:
    # botocore keeps a client's credentials only on its request signer.
    return getattr(getattr(client, "_request_signer", None), "_credentials", None)


def _refreshes(credentials: object) -> bool:
    return callable(getattr(credentials, "refresh_needed", None))


def sqs_secrets(client: Any) -> dict[str, Any]:
    """What the renewer process needs to make ``client`` and cannot find itself:
    fixed keys (given in code, from a profile chosen in code...), a proxy's URL
    with its password. Refreshing credentials are not sent (they would expire)."""
    secrets: dict[str, Any] = {
        name: url for name, url in _proxies_of(client).items() if redact_url(url) != url
    }
    credentials = _aws_credentials(client)
    if credentials is not None and not _refreshes(credentials):
        frozen = credentials.get_frozen_credentials()
        secrets["aws_access_key_id"] = frozen.access_key
        secrets["aws_secret_access_key"] = frozen.secret_key
        if frozen.token:
            secrets["aws_session_token"] = frozen.token
    return secrets


def _proxies_of(client: Any) -> dict[str, str]:
    config = getattr(getattr(client, "meta", None), "config", None)
    return proxy_options(getattr(config, "proxies", None))


def sqs_credentials_problem(client: Any) -> str | None:
    """Why the renewer process could not have ``client``'s credentials: they refresh
    through a provider built in this process (not one of botocore's chain), or
    through one its own chain would not find (a role assumed through a profile
    chosen in code); or, with none on the client, none in the environment either.
    None when it can."""
    credentials = _aws_credentials(client)
    if credentials is None:
        return aws_credentials_problem()
    if not _refreshes(credentials):
        return None  # sent to it (sqs_secrets)
    method = str(getattr(credentials, "method", "") or "")
    if method not in _AWS_CHAIN_METHODS:
        return (
            f"the client's AWS credentials refresh through a provider built in this process "
            f"({method or 'custom'}), which another process cannot rebuild"
        )
    return _chain_problem(credentials, method)


def _chain_problem(credentials: object, method: str) -> str | None:
    """Why the renewer process's own chain would not give it ``credentials``, which
    refresh through a ``method`` of botocore's chain. It builds them from the same
    environment and files as this process: only right when this process's chain
    finds them. A profile chosen in code (``boto3.Session(profile_name=...)``) that
    assumes a role is one it would not find: it would renew as whoever the default
    chain names."""
    import botocore.exceptions
    import botocore.session

    try:
        found = botocore.session.get_session().get_credentials()
    except botocore.exceptions.BotoCoreError as exc:
        return f"{type(exc).__name__}: {aws_configuration(exc)}"
    if found is None:
        return aws_credentials_problem()
    if _source_of(found) != _source_of(credentials):
        return (
            f"the client's AWS credentials ({method}) are not the ones this process's own "
            f"chain finds ({getattr(found, 'method', None) or 'others'}): a profile or role "
            "chosen in code, which the renewer process would not use (it would renew as "
            "another identity); name the profile in AWS_PROFILE for it to use the same"
        )
    return None


# What tells two refreshing credentials' sources apart: the role, SSO account or
# profile their fetcher was made for (botocore keeps them on it).
_SOURCE_FIELDS = ("_role_arn", "_start_url", "_account_id", "_role_name", "_profile_name")


def _source_of(credentials: object) -> tuple[object, ...]:
    """Where refreshing ``credentials`` come from, as far as it tells identities apart:
    their method, the function that refreshes them, the role, SSO account or profile
    its object was made for, and the text it closes over (a credential process's
    command). Two of the same role made at different times compare equal."""
    refresh = getattr(credentials, "_refresh_using", None)
    owner = getattr(refresh, "__self__", None)
    marks: list[object] = [getattr(credentials, "method", None)]
    marks.append(getattr(refresh, "__qualname__", type(refresh).__qualname__))
    marks.extend(str(getattr(owner, name, None)) for name in _SOURCE_FIELDS)
    for cell in getattr(refresh, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # (an empty cell)
            if isinstance(cell.cell_contents, str):
                marks.append(cell.cell_contents)
    return tuple(marks)

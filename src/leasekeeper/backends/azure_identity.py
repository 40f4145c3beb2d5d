"""An azure-identity credential built in code, and how another process makes one
like it.

The renewer process and Spark's executors cannot be sent a token credential: they
make their own from the spec. ``DefaultAzureCredential()`` alone is not enough.
A ``ManagedIdentityCredential(client_id=...)`` (a user-assigned identity) made in
code is another identity than the one the other process's default chain finds,
and on a machine whose only identity is user-assigned that chain finds none: every
renewal there would fail while the thread renewer, which uses the credential
itself, renews.

So the spec names the credential's class and, where one was given, its client id,
and a credential is only put in a spec when one made in this process from those
options compares equal to it (``identity_of``): same classes, same settings read
from the same environment. Anything else given in code (a tenant, an authority,
credentials left out of ``DefaultAzureCredential``'s chain) makes it compare
different, and the workers renew in a thread, with the credential itself.

This module reads the credential's own fields (azure-identity's and msal's
private ones among them) and imports no SDK: a field that moves in a future
version makes two credentials compare different, which costs the renewer process,
never the identity.
"""

from __future__ import annotations

from typing import Any

__all__ = ["REBUILT_CREDENTIALS", "credential_options", "identity_of", "make_credential"]

# azure-identity's credentials that another process makes from their class, the
# environment and at most a client id: what they find is what this process finds.
REBUILT_CREDENTIALS = frozenset(
    {
        "DefaultAzureCredential",
        "ManagedIdentityCredential",
        "EnvironmentCredential",
        "WorkloadIdentityCredential",
        "AzureCliCredential",
    }
)

# The keyword each class takes a user-assigned identity's client id by.
_CLIENT_ID_KEYWORD = {
    "DefaultAzureCredential": "managed_identity_client_id",
    "ManagedIdentityCredential": "client_id",
    "WorkloadIdentityCredential": "client_id",
}

# Fields whose value changes with use, not with identity: tokens and their cache,
# locks, HTTP plumbing, the chain's memory of which credential answered last.
_IN_USE = ("cache", "lock", "local", "pipeline", "http", "successful", "available")
_DEPTH = 8


def identity_of(credential: object) -> tuple[tuple[str, object], ...]:
    """What tells ``credential`` apart from another of its kind: the classes it is
    made of and every plain setting they hold (client and tenant ids, a token
    file's path, the chain's members...), not what changes with use. For
    comparison only: it may hold a secret read from the environment, so it is
    never logged."""
    found: list[tuple[str, object]] = []
    _walk(credential, type(credential).__name__, 0, set(), found)
    return tuple(found)


def _walk(
    value: object, path: str, depth: int, seen: set[int], found: list[tuple[str, object]]
) -> None:
    if value is None or isinstance(value, (str, int, float, bool)):
        found.append((path, value))
        return
    if depth > _DEPTH or id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, dict):
        items: list[tuple[str, object]] = [(str(key), item) for key, item in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(str(index), item) for index, item in enumerate(value)]
    elif type(value).__module__.split(".")[0] in ("azure", "msal"):
        found.append((path, type(value).__name__))
        items = list(getattr(value, "__dict__", {}).items())
    else:
        found.append((path, type(value).__name__))  # a function, a lock... : its kind only
        return
    for name, item in items:
        if not any(word in name.lower() for word in _IN_USE):
            _walk(item, f"{path}.{name}", depth + 1, seen, found)


def credential_options(credential: object) -> dict[str, str] | None:
    """The Azure factory's ``credential`` (the class's name) and ``client_id``
    options that make a credential like ``credential`` in another process; None
    when ``credential`` is not one of azure-identity's that such options remake
    (one built with other settings in code, or another class)."""
    kind = type(credential).__name__
    if kind not in REBUILT_CREDENTIALS or not type(credential).__module__.startswith(
        "azure.identity"
    ):
        return None
    wanted = identity_of(credential)
    keyword = _CLIENT_ID_KEYWORD.get(kind)
    client_ids = sorted(
        {
            value
            for path, value in wanted
            if keyword and isinstance(value, str) and value and _names_a_client(path)
        }
    )
    for client_id in [None, *client_ids]:
        try:
            like = make_credential(type(credential), client_id)
        except Exception:  # (a class that cannot be made so is not remade so)
            continue
        if identity_of(like) == wanted:
            return {"credential": kind, **({"client_id": client_id} if client_id else {})}
    return None


def _names_a_client(path: str) -> bool:
    name = path.rsplit(".", 1)[-1].strip("_").lower()
    return name in ("client_id", "id")


def make_credential(made_by: Any, client_id: str | None) -> Any:
    """An instance of the credential class ``made_by``, for the user-assigned
    identity ``client_id`` where one is given."""
    if client_id is None:
        return made_by()
    keyword = _CLIENT_ID_KEYWORD.get(made_by.__name__)
    if keyword is None:
        raise ValueError(f"a {made_by.__name__} takes no client_id")
    return made_by(**{keyword: client_id})

"""The queues one process renewer renews: the manager's backend first, then a
multi-queue worker's others. The renewer process rebuilds each from its spec; an
``Add`` frame names its lease's queue by its index here."""

from __future__ import annotations

import pickle
from collections.abc import Sequence

from leasekeeper.backends.contract import Backend
from leasekeeper.backends.spec import renewal_spec
from leasekeeper.config import LeaseConfig
from leasekeeper.errors import ConfigError


class RenewedQueues:
    """Leases are found by (queue index, message id): two queues' ids may coincide
    (Redis streams)."""

    def __init__(self, backend: Backend, more: Sequence[Backend]) -> None:
        self.all: tuple[Backend, ...] = (backend, *(q for q in more if q is not backend))
        self._index = {id(each): index for index, each in enumerate(self.all)}

    def index(self, backend: object) -> int | None:
        """The index of ``backend`` (None: not one of these)."""
        index = self._index.get(id(backend))
        return index if index is not None and self.all[index] is backend else None

    def require(self, backend: object) -> int:
        """The index of ``backend``; ConfigError when it is not one of these."""
        index = self.index(backend)
        if index is None:
            raise ConfigError(
                f"a process renewer renews the messages of {', '.join(map(repr, self.all))} "
                f"only, not of {backend!r}"
            )
        return index

    def payload(self, config: LeaseConfig) -> bytes:
        """What the renewer process builds from: the pickled (spec, config) and, for
        more queues, their specs. ConfigError for a queue that has no spec."""
        specs = [renewal_spec(queue) for queue in self.all]
        first, more = specs[0], specs[1:]
        return pickle.dumps((first, config, more) if more else (first, config))

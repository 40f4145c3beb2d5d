"""NullBackend: a backend that answers every call at once, and its spec.

For measuring what the lease machinery itself costs - the IPC of the process
renewer, say - with no service behind it: receive makes up messages, and every
extend, delete and release answers ok. ``NullSpec().build()`` makes one in any
process that can import this module (the renewer gets the worker's sys.path).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from leasekeeper.backends.base import OK, Backend, Handle, Message, Outcome


class NullBackend:
    max_batch = 10
    max_visibility = 43200.0
    rotates_receipts = False

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def spec(self) -> NullSpec:
        return NullSpec()

    def receive(
        self,
        max_messages: int = 1,
        wait_seconds: float = 0.0,
        visibility_timeout: float | None = None,
    ) -> list[Message]:
        now = time.monotonic()
        vis = 30.0 if visibility_timeout is None else visibility_timeout
        return [
            Message(
                id=f"n-{n}",
                body="x",
                receipt=f"r-{n}",
                backend=self,
                received_at=now,
                visibility_timeout=vis,
            )
            for n in itertools.islice(self._ids, max_messages)
        ]

    def adopt(self, raw: Any, visibility_timeout: float | None = None) -> Message:
        raise TypeError("NullBackend adopts nothing")

    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]:
        return [OK] * len(handles)

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        return [OK] * len(handles)

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]:
        return [OK] * len(handles)


@dataclass(frozen=True)
class NullSpec:
    def build(self) -> Backend:
        return NullBackend()

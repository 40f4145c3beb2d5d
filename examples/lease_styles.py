"""The three ways to hold a lease, on the in-memory queue.

.venv/bin/python examples/lease_styles.py
"""

from __future__ import annotations

import time

import leasekeeper
from leasekeeper import LeaseLost, LeaseManager, Message, lease, leased
from leasekeeper.backends.memory import MemoryQueue

queue = MemoryQueue(visibility_timeout=2.0)
TIMING = {"visibility_timeout": 2.0, "timer_interval": 0.2, "minimal_life": 0.5}


def with_a_manager() -> None:
    queue.send("explicit manager")
    with LeaseManager(queue, on_lost=lambda _lease, why: print("lost:", why), **TIMING) as manager:
        message = queue.receive()[0]
        with manager.lease(message) as held:
            for _step in range(3):
                time.sleep(1.0)  # 3 s of work on a 2 s timeout
                held.check()  # stop before anything irreversible if the lease was lost
        print("explicit manager:", held.state, "after", held.extensions, "extension(s)")


def with_the_default_manager() -> None:
    leasekeeper.configure(**TIMING)
    queue.send("default manager")
    message = queue.receive()[0]
    try:
        with lease(message):
            raise RuntimeError("the handler failed")
    except RuntimeError:
        print("default manager: released, visible again:", queue.visible_count() == 1)
    with lease(queue.receive()[0]):  # the retry succeeds: deleted
        pass


@leased(release_delay=5.0)
def decorated(message: Message) -> str:
    time.sleep(2.5)
    return f"handled {message.body!r}"


def main() -> None:
    with_a_manager()
    with_the_default_manager()
    queue.send("decorated handler")
    try:
        print(decorated(queue.receive()[0]))
    except LeaseLost as exc:
        print("lost:", exc)
    leasekeeper.shutdown()


if __name__ == "__main__":
    main()

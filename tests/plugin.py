"""A third party's queue service as ``pip install`` leaves it on disk: the module
``relay_plugin`` and a dist-info whose entry point registers the scheme ``relay``
in the group ``leasekeeper.backends``. leasekeeper has no code of it.

``relay://<stream>`` is Redis Streams on the server ``RELAY_REDIS_URL`` names, under
the plug-in's own class: enough to prove that a scheme found by entry point works
through ``connect``, ``spec().build()`` in another process, the process renewer
and ``leasekeeper worker --queue``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

PLUGIN = '''
"""relay://<stream>: Redis Streams on RELAY_REDIS_URL's server, under its own class."""

import os
import time

import leasekeeper
from leasekeeper.backends.base import ForwardingBackend


class RelayBackend(ForwardingBackend):
    pass


def factory(url, **options):
    time.sleep(float(os.environ.get("RELAY_BUILD_SECONDS", "0")))  # a slow SDK's import
    stream = url.split("://", 1)[1]
    inner = leasekeeper.connect(f"{os.environ['RELAY_REDIS_URL']}?stream={stream}", **options)
    return RelayBackend(inner)
'''


def write_plugin(folder: Path) -> Path:
    """Write the package into ``folder`` (a ``sys.path`` entry) and return it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "relay_plugin.py").write_text(textwrap.dedent(PLUGIN))
    info = folder / "relay_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: relay-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[leasekeeper.backends]\nrelay = relay_plugin:factory\n")
    return folder

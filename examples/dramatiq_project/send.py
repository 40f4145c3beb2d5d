"""Send render jobs: ``python send.py [count] [seconds]`` (default 3 jobs of 15 s)."""

from __future__ import annotations

import sys

from jobs import render

count = int(sys.argv[1]) if len(sys.argv) > 1 else 3
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 15.0
for index in range(count):
    render.send(f"job-{index}", seconds)
print(f"sent {count} jobs of {seconds:g}s")

"""``python -m benchmarks._child module:function JSON``: run one measurement in isolation."""

from __future__ import annotations

import importlib
import json
import sys
import traceback

from benchmarks.common import CHILD_MARKER, quiet_logs


def main(argv: list[str]) -> int:
    quiet_logs()
    target, raw = argv[1], argv[2]
    module_name, _, func_name = target.partition(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        result = func(**json.loads(raw))
    except Exception as exc:
        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(CHILD_MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

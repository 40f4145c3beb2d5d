"""``import leasekeeper`` imports none of its modules: each public name is imported on
its first use (the package's ``__getattr__``), so a process that needs a part - the
renewer process - pays for that part only. Every name still works, by attribute,
``from leasekeeper import X`` or ``*``."""

from __future__ import annotations

import subprocess
import sys

import leasekeeper


def run(code: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_import_leasekeeper_imports_no_module_of_it_until_a_name_is_used() -> None:
    code = (
        "import sys\n"
        "import leasekeeper\n"
        "def ours(): return sorted(m for m in sys.modules if m.startswith('leasekeeper.'))\n"
        "print(ours())\n"
        "leasekeeper.LeaseConfig\n"
        "print('leasekeeper.config' in ours(), 'leasekeeper.worker' in ours())\n"
        "from leasekeeper import Worker\n"
        "print('leasekeeper.worker' in ours(), Worker.__module__)\n"
    )
    assert run(code) == ["[]", "True False", "True leasekeeper.worker"]


def test_every_public_name_resolves_and_is_listed() -> None:
    code = (
        "import leasekeeper\n"
        "from leasekeeper import *\n"
        "names = leasekeeper.__all__\n"
        "print(all(getattr(leasekeeper, name) is globals()[name] for name in names))\n"
        "print(set(names) <= set(dir(leasekeeper)))\n"
    )
    assert run(code) == ["True", "True"]


def test_the_lease_decorator_stays_the_public_lease_once_its_module_is_imported() -> None:
    """``leasekeeper.lease`` is the decorator of ``leasekeeper.defaults``, not the
    module ``leasekeeper.lease``, whichever is imported first."""
    code = (
        "import leasekeeper.lease\n"
        "import leasekeeper, leasekeeper.defaults\n"
        "print(leasekeeper.lease is leasekeeper.defaults.lease)\n"
        "from leasekeeper import lease\n"
        "print(lease is leasekeeper.defaults.lease)\n"
    )
    assert run(code) == ["True", "True"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        leasekeeper.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("leasekeeper.NoSuchThing resolved")

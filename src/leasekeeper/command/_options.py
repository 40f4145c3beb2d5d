"""What the ``leasekeeper`` commands parse alike: numbers, the LeaseConfig flags and
``--version``.

Every numeric flag takes its type from ``number()``, so every bad value gets the
same message, naming what the flag takes: ``--concurrency -5``, ``--concurrency 0``
and ``--concurrency many`` all say "expected an integer >= 1, got ...". A
LeaseConfig's own rules (one field against another) are reported in flag names.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import re
from collections.abc import Sequence
from typing import Any

from leasekeeper.config import ON_CAP_CHOICES, LeaseConfig
from leasekeeper.errors import ConfigError

__all__ = [
    "add_config_flags",
    "add_version_flag",
    "config_field_help",
    "config_from",
    "flag",
    "glue_weights",
    "in_flag_terms",
    "number",
    "weights",
]


def number(
    kind: type[int] | type[float], low: float, *, inclusive: bool = True, also: str | None = None
) -> Any:
    """An argparse type: a finite number of ``kind`` at least (``inclusive``) or
    above ``low``; ``also`` names one word it accepts as well (``"auto"``)."""
    noun = "an integer" if kind is int else "a number"
    expected = f"{noun} {'>=' if inclusive else '>'} {low:g}"
    if also is not None:
        expected += f" or {also!r}"

    def parse(text: str) -> int | float | str:
        if also is not None and text == also:
            return text
        try:
            value = kind(text)
            in_range = math.isfinite(value) and (value > low or (inclusive and value == low))
        except (ValueError, OverflowError):
            in_range = False
        if not in_range:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in some messages
    return parse


def weights(text: str) -> list[int]:
    """An argparse type: ``--weights 3,1``, integers >= 1 separated by commas."""
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise argparse.ArgumentTypeError(
            f"expected integers >= 1 separated by commas (3,1), got {text!r}"
        )
    return [int(part) for part in parts]


def glue_weights(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--weights -1,1`` spelled ``--weights=-1,1``: argparse takes a
    value that starts with "-" (and is not one negative number) for a flag and says
    only "expected one argument"; glued, the value gets ``weights``' own message."""
    out = list(argv)
    for index, word in enumerate(out[:-1]):
        if word == "--weights" and re.fullmatch(r"-[0-9.,\s+-]*", out[index + 1]):
            out[index : index + 2] = [f"--weights={out[index + 1]}"]
            break
    return out


def flag(field: str) -> str:
    """The command-line flag of a LeaseConfig field: ``--visibility-timeout``."""
    return "--" + field.replace("_", "-")


# What one LeaseConfig field takes on its own (LeaseConfig checks the rest): kind,
# lower bound, bound included, and another word it accepts. A field not listed
# takes a number >= 0.
FIELD_VALUES: dict[str, tuple[type[int] | type[float], float, bool, str | None]] = {
    "visibility_timeout": (float, 0, False, None),
    "timer_interval": (float, 0, False, None),
    "extend_threshold": (float, 0, False, "auto"),
    "minimal_life": (float, 0, False, None),
    "max_lease_duration": (float, 0, False, None),
    "release_backoff": (float, 1, True, None),
    "max_concurrency": (int, 1, True, None),
    "max_receives": (int, 1, True, None),
    "stall_timeout": (float, 0, False, None),
}

# The fields that take one of a few words, not a number.
FIELD_CHOICES: dict[str, tuple[str, ...]] = {"on_cap": ON_CAP_CHOICES}

# The fields that are not seconds or counts.
METAVARS = {"release_backoff": "FACTOR", "extend_threshold": "S|auto"}


def config_field_help() -> dict[str, str]:
    """Each LeaseConfig field's description, from its docstring (one source of
    truth), as plain text: no reStructuredText markup."""
    doc = inspect.cleandoc(LeaseConfig.__doc__ or "")
    names = {f.name for f in dataclasses.fields(LeaseConfig)}
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in doc.splitlines():
        if line.strip() in names and not line.startswith(" "):
            current = out.setdefault(line.strip(), [])
        elif current is not None and line.startswith(" "):
            current.append(line.strip())
        elif not line.strip():
            continue
        else:
            current = None
    # Plain text: add_config_flags escapes "%" for argparse, once (escaped here as
    # well, --help printed "20 %%").
    return {name: plain(" ".join(words)) for name, words in out.items()}


def plain(text: str) -> str:
    """A docstring's words for a terminal: ``None`` as "unset", no literal markup,
    field names as their flags."""
    text = text.replace("``None`` derives", "Unset, it is").replace("``None``", "Unset")
    text = re.sub(r"``([^`]+)``", r"\1", text)
    return in_flag_terms(text)


def in_flag_terms(text: str) -> str:
    """``text`` with LeaseConfig field names spelled as their flags."""
    names = sorted((f.name for f in dataclasses.fields(LeaseConfig)), key=len, reverse=True)
    # Not a keyword in a repr (``visibility_timeout=30``): that is Python, not a flag.
    pattern = re.compile(r"(?<![\w-])(" + "|".join(names) + r")(?![\w=-])")
    return pattern.sub(lambda match: flag(match.group(1)), text)


def add_config_flags(group: argparse._ActionsContainer) -> None:
    """One flag per LeaseConfig field, explained by the field's docstring."""
    # argparse %-formats help text: a "20 %" in a docstring must reach it as "%%".
    descriptions = {name: text.replace("%", "%%") for name, text in config_field_help().items()}
    for field in dataclasses.fields(LeaseConfig):
        choices = FIELD_CHOICES.get(field.name)
        if choices is not None:
            group.add_argument(
                flag(field.name),
                dest=field.name,
                choices=choices,
                help=f"{descriptions.get(field.name, '')} (default: {field.default})",
            )
            continue
        kind, low, inclusive, also = FIELD_VALUES.get(field.name, (float, 0, True, None))
        if field.default is None:
            shown = "derived" if field.name == "extend_threshold" else "unset"
        else:
            shown = f"{field.default:g}"
        group.add_argument(
            flag(field.name),
            dest=field.name,
            type=number(kind, low, inclusive=inclusive, also=also),
            metavar=METAVARS.get(field.name, "N" if kind is int else "S"),
            help=f"{descriptions.get(field.name, '')} (default: {shown})",
        )


def config_from(args: argparse.Namespace) -> LeaseConfig:
    """The LeaseConfig the flags describe (``ConfigError`` in flag terms when the
    values do not go together)."""
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(LeaseConfig)
        if getattr(args, f.name, None) is not None
    }
    try:
        return LeaseConfig(**given)
    except ConfigError as exc:
        raise ConfigError(in_flag_terms(str(exc))) from None


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    from leasekeeper import __version__

    parser.add_argument(
        "--version",
        action="version",
        version=f"leasekeeper {__version__}",
        help="print leasekeeper's version and exit",
    )

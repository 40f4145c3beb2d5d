"""A timeline drawn in a terminal: one row per job (more where runs overlap).

```text
(c) short timeout + leasekeeper   done 3/3, 0 duplicate runs, 13 renewals
       0  ·  ·  ·  ·  5  ·  ·  ·  ·  10 ·  ·  ·  ·  15 ·  ·  ·  ·  20 ·  ·  ·  ·   units
job-1  1━+✗ 5━+━+━+━+✓
job-2  2━+━+━+━+✓
job-3  3━+━+━+━+✓
```

Each run starts with the number of its worker, then runs right for as long as it
lasted: ``+`` a renewal, ``✓`` deleted, ``✗`` crashed, ``⊘`` done but the delete was
refused (another worker had the message by then), ``▸`` still running at the end;
a duplicate run (started while another worker was on the job) is drawn ``≈``.
With ``unicode=False`` the glyphs are ASCII; with ``color=True`` runs take their
worker's colour and duplicates are red (ANSI SGR codes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from leasekeeper.timeline.model import Run, Timeline, lanes

__all__ = ["Glyphs", "legend", "render_text"]


@dataclass(frozen=True)
class Glyphs:
    body: str
    duplicate: str
    renewal: str
    ending: dict[str, str]


UNICODE = Glyphs("━", "≈", "+", {"completed": "✓", "crashed": "✗", "refused": "⊘", "cut off": "▸"})
ASCII = Glyphs("=", "~", "+", {"completed": "#", "crashed": "X", "refused": "x", "cut off": ">"})

_WORKER_COLORS = ("36", "32", "33", "34", "35")  # cyan, green, yellow, blue, magenta
_RED = "31;1"
_RESET = "\x1b[0m"
_ENDING_COLORS = {"completed": "32;1", "crashed": "31;1", "refused": "31", "cut off": "2"}


def _worker_number(worker: str) -> str:
    digits = worker[len(worker.rstrip("0123456789")) :]
    return digits[-1:] or worker[:1]


def _worker_color(worker: str) -> str:
    digits = worker[len(worker.rstrip("0123456789")) :]
    return _WORKER_COLORS[(int(digits) - 1 if digits else 0) % len(_WORKER_COLORS)]


def render_text(
    timeline: Timeline,
    *,
    width: int = 72,
    color: bool = False,
    unicode: bool = True,
    now: float | None = None,
) -> list[str]:
    """The lines of ``timeline``'s picture: a title, a time axis, a row per lane.
    ``width`` is the time axis's columns; ``now`` where running runs end (the
    timeline's own clock when None)."""
    glyphs = UNICODE if unicode else ASCII
    at = timeline.now() if now is None else now
    runs = timeline.snapshot()
    columns = max(10, width)
    # A run's end mark and the next run's worker number need a column each.
    rows = lanes(runs, at, timeline.names, gap=timeline.horizon / columns)
    label_width = max([len(job) for job, _ in rows] + [5]) + 2

    def column(t: float) -> int:
        return max(0, min(columns - 1, int(t / timeline.horizon * columns + 1e-6)))

    title = timeline.title + (f"   {timeline.summary}" if timeline.summary else "")
    lines = [_styled(title, "1", color)]
    lines.append(" " * label_width + _axis(timeline, columns, column, unicode))
    previous_job = None
    for job, row in rows:
        cells: list[tuple[str, str]] = [(" ", "")] * columns
        for run in row:
            _draw_run(cells, run, at, column, glyphs)
        label = job if job != previous_job else ""
        previous_job = job
        text = "".join(_styled(char, style, color) for char, style in _merge(cells))
        lines.append(label.ljust(label_width) + text.rstrip())
    if not rows:
        lines.append(" " * label_width + "(nothing received yet)")
    return lines


def _axis(timeline: Timeline, columns: int, column: Callable[[float], int], unicode: bool) -> str:
    axis = [" "] * columns
    dot = "·" if unicode else "."
    units = int(timeline.horizon / timeline.unit)
    step = 5 if units > 12 else 1
    for n in range(units + 1):
        col = column(n * timeline.unit)
        if n % step:
            axis[col] = dot
    for n in range(0, units + 1, step):
        label = str(n)
        col = column(n * timeline.unit)
        if col + len(label) <= columns:
            axis[col : col + len(label)] = list(label)
    return "".join(axis) + " units"


def _draw_run(
    cells: list[tuple[str, str]],
    run: Run,
    now: float,
    column: Callable[[float], int],
    glyphs: Glyphs,
) -> None:
    first = column(run.start)
    last = column(run.last(now))
    if run.end is not None:
        last = min(len(cells) - 1, max(last, first + 1))
    style = _RED if run.duplicate else _worker_color(run.worker)
    body = glyphs.duplicate if run.duplicate else glyphs.body
    for col in range(first + 1, last + 1):
        cells[col] = (body, style)
    for t in run.renewals:
        col = column(t)
        if first < col <= last:
            cells[col] = (glyphs.renewal, style + ";1")
    if run.end is not None and last > first:
        cells[last] = (glyphs.ending[run.ending], _ENDING_COLORS[run.ending])
    cells[first] = (_worker_number(run.worker), style + ";7")  # reversed: where it began


def _merge(cells: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Consecutive cells of one style joined, so each colour change costs one code."""
    merged: list[tuple[str, str]] = []
    for char, style in cells:
        if merged and merged[-1][1] == style:
            merged[-1] = (merged[-1][0] + char, style)
        else:
            merged.append((char, style))
    return merged


def _styled(text: str, style: str, color: bool) -> str:
    if not color or not style or not text.strip():
        return text
    return f"\x1b[{style}m{text}{_RESET}"


def legend(*, unicode: bool = True) -> str:
    """Two lines saying what the glyphs mean."""
    g = UNICODE if unicode else ASCII
    e = g.ending
    return (
        f"1-5 the worker that received the job, then: {g.body} processing   "
        f"{g.renewal} renewal   {g.duplicate} a duplicate run\n"
        f"{e['completed']} deleted   {e['crashed']} crashed   {e['refused']} delete refused "
        f"(another worker had the message)   {e['cut off']} still running"
    )

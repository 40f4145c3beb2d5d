"""Timelines as one SVG picture, written by hand (no dependency), for a browser
or a README.

Each timeline is a panel: its title and summary, a time axis, and a row per job
(more where runs overlap, as in the terminal picture). A run is a bar in its
worker's colour, labelled with the worker; duplicates are red and hatched;
renewals are white ticks across the bar; a crash is a red cross, a delete a
check mark, a refused delete a grey cross. A dashed arc joins a crashed run to
the re-delivery of its job, labelled with the time between. Elements carry
classes (``run``, ``duplicate``, ``renewal``, ``crash``, ``done``, ``refused``,
``redelivery``, ``mark``) so a test or a stylesheet can find them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from xml.sax.saxutils import escape, quoteattr

from leasekeeper.timeline.model import Run, Timeline, lanes

__all__ = ["render_svg"]

WIDTH = 960
LEFT = 78  # job labels
RIGHT = 24
ROW = 22
BAR = 14
PANEL_TOP = 72  # title, summary, the axis labels below it, room for an arc above the first row
PANEL_GAP = 26
WORKER_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf")
RED = "#d62728"
SANS = "system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif"


def _worker_color(worker: str) -> str:
    digits = worker[len(worker.rstrip("0123456789")) :]
    return WORKER_COLORS[(int(digits) - 1 if digits else 0) % len(WORKER_COLORS)]


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def render_svg(timelines: Sequence[Timeline], *, heading: str = "", footnote: str = "") -> str:
    """The SVG document (a string) of ``timelines``, one panel each, under
    ``heading``, with a legend and ``footnote`` at the bottom."""
    plot = WIDTH - LEFT - RIGHT
    parts: list[str] = []
    y = 16.0
    if heading:
        parts.append(_text(LEFT, y + 12, heading, size=15, weight="bold"))
        y += 30
    for timeline in timelines:
        y = _panel(parts, timeline, y, plot) + PANEL_GAP
    y = _legend(parts, y)
    if footnote:
        parts.append(_text(LEFT, y + 14, footnote, size=11, fill="#555"))
        y += 22
    height = int(y + 10)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family={quoteattr(SANS)}>\n'
        "<title>leasekeeper timelines</title>\n"
        "<defs>\n"
        '<pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)">'
        '<rect width="6" height="6" fill="#d62728"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#ff9896" stroke-width="3"/></pattern>\n'
        "</defs>\n"
        f'<rect class="background" width="{WIDTH}" height="{height}" fill="#ffffff" rx="8"/>\n'
    )
    return head + "\n".join(parts) + "\n</svg>\n"


def _text(
    x: float,
    y: float,
    text: str,
    *,
    size: int = 12,
    weight: str = "normal",
    fill: str = "#222",
    anchor: str = "start",
    cls: str = "",
) -> str:
    attributes = f' class="{cls}"' if cls else ""
    return (
        f'<text{attributes} x="{_num(x)}" y="{_num(y)}" font-size="{size}" '
        f'font-weight="{weight}" fill="{fill}" text-anchor="{anchor}">{escape(text)}</text>'
    )


def _panel(parts: list[str], timeline: Timeline, top: float, plot: float) -> float:
    """Draw one timeline's panel from ``top``; return where it ends."""
    now = timeline.finished if timeline.finished is not None else timeline.now()
    # Room between runs of a row for the first one's end mark.
    rows = lanes(timeline.snapshot(), now, timeline.names, gap=16 * timeline.horizon / plot)

    def x(t: float) -> float:
        return LEFT + max(0.0, min(1.0, t / timeline.horizon)) * plot

    parts.append(f'<g class="timeline" data-title={quoteattr(timeline.title)}>')
    parts.append(_text(LEFT, top + 14, timeline.title, size=14, weight="bold", cls="title"))
    if timeline.summary:
        parts.append(_text(LEFT, top + 30, timeline.summary, size=12, fill="#555"))
    axis_y = top + PANEL_TOP - 14
    first_row = top + PANEL_TOP
    bottom = first_row + ROW * max(1, len(rows))
    parts.append(
        f'<line class="axis" x1="{LEFT}" y1="{_num(axis_y)}" x2="{_num(LEFT + plot)}" '
        f'y2="{_num(axis_y)}" stroke="#999"/>'
    )
    units = int(timeline.horizon / timeline.unit + 1e-9)
    for n in range(units + 1):
        tx = x(n * timeline.unit)
        major = n % 5 == 0
        parts.append(
            f'<line x1="{_num(tx)}" y1="{_num(axis_y - (5 if major else 2))}" x2="{_num(tx)}" '
            f'y2="{_num(bottom if major else axis_y)}" stroke="{"#e3e3e3" if major else "#999"}"/>'
        )
        if major:
            parts.append(_text(tx, axis_y - 8, str(n), size=10, fill="#777", anchor="middle"))
    parts.append(_text(LEFT + plot, top + 14, "time (units)", size=10, fill="#777", anchor="end"))
    for when, label in timeline.marked():
        mx = x(when)
        parts.append(
            f'<line class="mark" x1="{_num(mx)}" y1="{_num(axis_y)}" x2="{_num(mx)}" '
            f'y2="{_num(bottom)}" stroke="#888" stroke-dasharray="2 3"/>'
        )
        parts.append(_text(mx + 3, bottom + 12, label, size=10, fill="#666"))
    previous_job = None
    crashes: dict[str, Run] = {}
    for index, (job, row) in enumerate(rows):
        row_y = first_row + index * ROW
        if job != previous_job:
            parts.append(_text(LEFT - 10, row_y + BAR - 2, job, size=12, anchor="end"))
        previous_job = job
        for run in row:
            _run(parts, run, row_y, now, x)
            if run.ending == "crashed":
                crashes[job] = run
    # Re-deliveries after a crash: a dashed arc from the crash to the next run.
    by_job: dict[str, list[tuple[float, Run]]] = {}
    for index, (job, row) in enumerate(rows):
        for run in row:
            by_job.setdefault(job, []).append((first_row + index * ROW, run))
    for job, crashed in crashes.items():
        later = [(ry, r) for ry, r in by_job[job] if r.redelivery and r.start >= (crashed.end or 0)]
        if not later:
            continue
        if min(r.start for _, r in later) - (crashed.end or 0.0) < 0.3 * timeline.unit:
            continue  # taken at once: it had been re-delivered before the crash
        crash_y = next(ry for ry, r in by_job[job] if r is crashed)
        run_y, run = min(later, key=lambda item: item[1].start)
        x0, x1 = x(crashed.end or 0.0), x(run.start)
        y0, y1 = crash_y + BAR / 2, run_y + BAR / 2
        lift = min(y0, y1) - 9
        parts.append(
            f'<path class="redelivery" d="M{_num(x0)},{_num(y0)} C{_num(x0)},{_num(lift)} '
            f'{_num(x1)},{_num(lift)} {_num(x1)},{_num(y1)}" fill="none" stroke="{RED}" '
            'stroke-width="1.2" stroke-dasharray="3 2"/>'
        )
        gap = run.start - (crashed.end or 0.0)
        label = f"back after {gap / timeline.unit:.1f} units"
        after = max(x(run.last(now)), x1 + 3) + 16
        room_after = all(
            x(r.start) > after + 7 * len(label)
            for ry, r in by_job[job]
            if ry == run_y and r.start > run.start
        )
        if x1 - x0 >= 150 or (not room_after and min(y0, y1) <= first_row + ROW):
            # Over the arc: a long one has room there, and so has one on the first row.
            parts.append(_text((x0 + x1) / 2, lift - 2, label, size=10, fill=RED, anchor="middle"))
        elif room_after:  # a short arc between rows: after the re-delivered run instead
            parts.append(_text(after, run_y + BAR - 3, label, size=10, fill=RED))
    parts.append("</g>")
    return bottom + (14 if timeline.marks else 0)


def _run(parts: list[str], run: Run, row_y: float, now: float, x: Callable[[float], float]) -> None:
    x0 = x(run.start)
    x1 = max(x(run.last(now)), x0 + 3)
    classes = "run duplicate" if run.duplicate else "run"
    fill = "url(#hatch)" if run.duplicate else _worker_color(run.worker)
    tip = f"{run.worker}: {run.job}, {run.ending}" + (" (duplicate)" if run.duplicate else "")
    parts.append(
        f'<rect class="{classes}" data-worker={quoteattr(run.worker)} x="{_num(x0)}" '
        f'y="{_num(row_y)}" width="{_num(x1 - x0)}" height="{BAR}" rx="3" fill="{fill}">'
        f"<title>{escape(tip)}</title></rect>"
    )
    if x1 - x0 >= 20:
        parts.append(_text(x0 + 3, row_y + BAR - 3, run.worker, size=10, fill="#fff"))
    for t in run.renewals:
        rx = x(t)
        if x0 + 1 < rx < x1:
            parts.append(
                f'<line class="renewal" x1="{_num(rx)}" y1="{_num(row_y + 2)}" x2="{_num(rx)}" '
                f'y2="{_num(row_y + BAR - 2)}" stroke="#fff" stroke-width="1.6"/>'
            )
    cy = row_y + BAR / 2
    if run.ending == "completed":
        parts.append(
            f'<path class="done" d="M{_num(x1 + 3)},{_num(cy)} l3,4 l6,-9" fill="none" '
            'stroke="#2a7d2a" stroke-width="2"/>'
        )
    elif run.ending in ("crashed", "refused"):
        color, cls = (RED, "crash") if run.ending == "crashed" else ("#888", "refused")
        d = 4 if cls == "crash" else 3
        parts.append(
            f'<path class="{cls}" d="M{_num(x1 + 2)},{_num(cy - d)} l{2 * d},{2 * d} '
            f'm0,{-2 * d} l{-2 * d},{2 * d}" stroke="{color}" stroke-width="2"/>'
        )
    elif run.ending == "cut off":
        parts.append(
            f'<path class="cut" d="M{_num(x1 + 2)},{_num(cy - 4)} l5,4 l-5,4" fill="none" '
            'stroke="#888" stroke-width="1.5"/>'
        )


def _legend(parts: list[str], top: float) -> float:
    """Worker colours and what the marks mean; returns where it ends."""
    x = float(LEFT)
    y = top + 4
    for n, color in enumerate(WORKER_COLORS, start=1):
        parts.append(
            f'<rect class="legend" x="{_num(x)}" y="{_num(y)}" width="22" height="{BAR}" '
            f'rx="3" fill="{color}"/>'
        )
        parts.append(_text(x + 3, y + BAR - 3, f"w{n}", size=10, fill="#fff"))
        x += 28
    parts.append(_text(x + 2, y + BAR - 3, "workers", size=11, fill="#444"))
    x += 62
    items = [
        (
            '<rect x="{x}" y="{y}" width="22" height="14" rx="3" fill="url(#hatch)"/>',
            "duplicate run",
        ),
        (
            '<rect x="{x}" y="{y}" width="22" height="14" rx="3" fill="#999"/>'
            '<line x1="{m}" y1="{y2}" x2="{m}" y2="{y12}" stroke="#fff" stroke-width="1.6"/>',
            "renewal",
        ),
        (
            '<path d="M{x3},{c} l3,4 l6,-9" fill="none" stroke="#2a7d2a" stroke-width="2"/>',
            "deleted",
        ),
        (
            '<path d="M{x3},{c4} l8,8 m0,-8 l-8,8" stroke="#d62728" stroke-width="2"/>',
            "crashed",
        ),
        (
            '<path d="M{x3},{c3} l6,6 m0,-6 l-6,6" stroke="#888" stroke-width="2"/>',
            "delete refused",
        ),
        (
            '<path d="M{x},{c} C{x},{y} {x22},{y} {x22},{c}" fill="none" stroke="#d62728" '
            'stroke-dasharray="3 2"/>',
            "re-delivered",
        ),
    ]
    for template, label in items:
        c = y + BAR / 2
        parts.append(
            template.format(
                x=_num(x),
                y=_num(y),
                m=_num(x + 11),
                y2=_num(y + 2),
                y12=_num(y + BAR - 2),
                x3=_num(x + 3),
                x22=_num(x + 22),
                c=_num(c),
                c3=_num(c - 3),
                c4=_num(c - 4),
            )
        )
        parts.append(_text(x + 28, y + BAR - 3, label, size=11, fill="#444"))
        x += 28 + 7 * len(label) + 14
    return y + BAR + 8

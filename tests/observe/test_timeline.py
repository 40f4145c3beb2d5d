"""Timelines: what the demo's pictures show, in a terminal and as SVG."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from leasekeeper import LeaseManager
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.command.cli import main
from leasekeeper.testing import ManualClock
from leasekeeper.timeline import Timeline, TimelineObserver, legend, render_svg, render_text
from tests.helpers import svg_text_problems

SVG = "{http://www.w3.org/2000/svg}"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def crash_story() -> Timeline:
    """job-1: w1 crashes at 1, w2 takes it at 1.5 and completes it, renewed twice;
    job-2: w3 runs it, w4 runs it again meanwhile (a duplicate) and is refused."""
    timeline = Timeline("(x) a story", horizon=10.0, unit=1.0, summary="done 2/2")
    timeline.names.update({"m-1": "job-1", "m-2": "job-2"})
    crashed = timeline.start_run("m-1", "w1", at=0.0)
    timeline.end_run(crashed, "crashed", at=1.0)
    timeline.mark("w1 crashes", at=1.0)
    again = timeline.start_run("m-1", "w2", redelivery=True, at=1.5)
    timeline.renewed("m-1", "w2", at=2.5)
    timeline.renewed("m-1", "w2", at=3.5)
    timeline.end_run(again, "completed", at=4.5)
    first = timeline.start_run("m-2", "w3", at=0.0)
    duplicate = timeline.start_run("m-2", "w4", duplicate=True, at=1.0)
    timeline.end_run(first, "completed", at=3.0)
    timeline.end_run(duplicate, "refused", at=4.0)
    timeline.start_run("m-2", "w5", duplicate=True, at=6.0)
    timeline.finish(at=8.0)  # w5's run is cut off here
    return timeline


def test_the_terminal_picture_shows_runs_renewals_crash_and_duplicates() -> None:
    lines = render_text(crash_story(), width=40)
    title, axis, *rows = lines
    assert title == "(x) a story   done 2/2"
    assert axis.split()[:3] == ["0", "1", "2"] and axis.endswith("units")
    # job-1: w1's crashed run, then w2's re-delivery on the same row, renewed twice.
    assert rows[0] == "job-1  1━━━✗ 2━━━+━━━+━━━✓"
    # job-2: w3's run, and w5's later duplicate (cut off at the end) on its row; w4's
    # duplicate overlapped w3's, so it has a row of its own, and its delete was refused.
    assert rows[1] == "job-2  3━━━━━━━━━━━✓           5≈≈≈≈≈≈≈▸"
    assert rows[2] == "           4≈≈≈≈≈≈≈≈≈≈≈⊘"
    assert len(rows) == 3


def test_ascii_and_colour_variants_say_the_same() -> None:
    story = crash_story()
    ascii_lines = render_text(story, width=40, unicode=False)
    assert all(line.isascii() for line in ascii_lines)
    assert ascii_lines[2] == "job-1  1===X 2===+===+===#"
    plain = render_text(story, width=40)
    coloured = render_text(story, width=40, color=True)
    assert any("\x1b[" in line for line in coloured)
    assert [ANSI.sub("", line) for line in coloured] == plain
    assert legend(unicode=False).isascii() and "renewal" in legend()


def test_the_svg_parses_and_has_a_mark_for_everything() -> None:
    story = crash_story()
    empty = Timeline("(y) nothing yet", horizon=10.0)
    document = render_svg([story, empty], heading="a heading & more", footnote="<note>")
    root = ET.fromstring(document)
    assert root.tag == f"{SVG}svg"
    assert int(root.attrib["width"]) > 0 and int(root.attrib["height"]) > 0

    def find(cls: str) -> list[ET.Element]:
        return [e for e in root.iter() if cls in e.attrib.get("class", "").split()]

    titles = [e.text for e in find("title")]
    assert titles == ["(x) a story", "(y) nothing yet"]
    assert len(find("timeline")) == 2
    runs = find("run")
    assert len(runs) == 5
    assert sorted(r.attrib["data-worker"] for r in find("duplicate")) == ["w4", "w5"]
    assert len(find("renewal")) == 2
    assert len(find("crash")) == 1 and len(find("done")) == 2 and len(find("refused")) == 1
    assert len(find("redelivery")) == 1 and len(find("mark")) == 1
    texts = [e.text or "" for e in root.iter(f"{SVG}text")]
    assert "a heading & more" in texts and "<note>" in texts
    assert "back after 0.5 units" in texts
    assert svg_text_problems(document) == []


def test_the_readme_picture_has_no_overlapping_text() -> None:
    """docs/img/demo.svg, drawn by leasekeeper demo --svg: the README shows it."""
    picture = Path(__file__).resolve().parents[2] / "docs" / "img" / "demo.svg"
    assert svg_text_problems(picture.read_text()) == []


def test_the_overlap_check_finds_a_subtitle_over_an_axis_label() -> None:
    """What the demo picture once had: the summary line over the axis numbers."""
    document = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="960" height="100">'
        '<text x="78" y="76" font-size="12">done 3/3, 0 duplicate runs, 0 renewals</text>'
        '<text x="249.6" y="84" font-size="10" text-anchor="middle">5</text>'
        '<text x="950" y="20" font-size="12">cut off</text></svg>'
    )
    assert svg_text_problems(document) == [
        "'cut off' leaves the 960x100 canvas",
        "'done 3/3, 0 duplicate runs, 0 renewals' overlaps '5'",
    ]


def test_the_observer_adds_a_managers_renewals_to_the_run(clock: ManualClock) -> None:
    queue = MemoryQueue(30, clock=clock)
    manager = LeaseManager(queue, clock=clock, visibility_timeout=30)
    timeline = Timeline("renewals", horizon=100.0)
    manager.add_observer(TimelineObserver(timeline, "w1"))
    queue.send("job")
    message = queue.receive()[0]
    run = timeline.start_run(message.id, "w1")
    lease = manager.register(message)
    clock.advance(65)
    lease.complete()
    timeline.end_run(run, "completed")
    (drawn,) = timeline.snapshot()
    assert len(drawn.renewals) == lease.extensions == 3
    with pytest.raises(ValueError):
        timeline.end_run(run, "exploded")


def test_demo_command_passes_svg_on(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    import leasekeeper.command.demo

    seen: dict[str, Any] = {}

    def fake_run_demo(seconds: float, **kwargs: Any) -> list[Any]:
        seen.update(kwargs, seconds=seconds)

        class Clean:
            duplicates = 0

        return [Clean(), Clean(), Clean()]

    monkeypatch.setattr(leasekeeper.command.demo, "run_demo", fake_run_demo)
    assert main(["demo", "--seconds", "3", "--svg", "out.svg"]) == 0
    assert seen == {"seconds": 3.0, "svg": "out.svg"}
    assert "out.svg" in capsys.readouterr().out

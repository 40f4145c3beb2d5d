"""The test tasks' journal is read while worker processes append to it."""

from __future__ import annotations

from pathlib import Path

from tests.frameworks import journal


def test_a_line_still_being_written_is_left_for_the_next_read(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    journal.write(str(path), "start", "long")
    whole = path.read_text()
    # What a read sees when it overlaps the next write: part of a line, no newline.
    path.write_text(whole + "end lo")
    assert [(e.event, e.label) for e in journal.read(path)] == [("start", "long")]
    path.write_text(whole + whole.replace("start", "end"))
    assert [(e.event, e.label) for e in journal.read(path)] == [("start", "long"), ("end", "long")]


def test_no_journal_yet_is_no_entries(tmp_path: Path) -> None:
    assert journal.read(tmp_path / "journal") == []

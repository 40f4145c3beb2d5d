"""The crash tests' judge, judged: ``analyse`` on hand-written journals, so a
failure the crash tests are meant to catch is known to be caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.crash.journal import Entry, Journal, analyse, read_journal

SENT = ["a", "b", "c"]


def _entries(*lines: str) -> list[Entry]:
    out: list[Entry] = []
    for n, line in enumerate(lines):
        worker, event, *rest = line.split()
        arg = rest[0] if rest else "-"
        out.append(Entry(int(worker), 1000 + int(worker), float(n), event, arg, tuple(rest[1:])))
    return out


def _clean_run(*extra: str) -> list[str]:
    lines = []
    for mid in SENT:
        lines += [f"0 recv {mid}", f"0 start {mid}", f"0 done {mid}", f"0 deleted {mid}"]
    return lines + list(extra)


def test_a_clean_run_has_no_problems_and_no_duplicates() -> None:
    result = analyse(_entries(*_clean_run()), SENT, killed=[])
    assert result.problems() == []
    assert result.total_duplicates == 0


def test_a_kill_between_done_and_delete_makes_an_unavoidable_duplicate() -> None:
    lines = [
        "0 recv a",
        "0 start a",
        "0 done a",
        "0 kill after_handler_before_delete a",
        "1 recv a",
        "1 start a",
        "1 done a",
        "1 deleted a",
    ]
    lines += [line for line in _clean_run() if line.split()[2] != "a"]
    result = analyse(_entries(*lines), SENT, killed=[0])
    assert result.problems() == []
    assert result.duplicates == {"a": 1}
    assert result.unavoidable == {"a": 1}
    assert result.orphaned_at_kill == {0: ["a"]}
    assert result.self_kills == {0: ("after_handler_before_delete", ["a"])}


def test_a_duplicate_without_a_kill_is_unexplained() -> None:
    lines = [*_clean_run(), "1 recv a", "1 start a", "1 done a"]
    result = analyse(_entries(*lines), SENT, killed=[])
    assert result.unexplained == {"a": 1}
    assert any("processed again after" in p for p in result.problems())
    assert any("no crash explains" in p for p in result.problems())


def test_a_duplicate_after_a_confirmed_delete_is_not_excused_by_a_later_kill() -> None:
    # Worker 0 had its delete of "a" confirmed, then was killed: "a" must not come back.
    lines = [*_clean_run(), "1 recv a", "1 start a", "1 done a", "1 deleted a"]
    result = analyse(_entries(*lines), SENT, killed=[0])
    assert result.unexplained == {"a": 1}
    assert result.done_after_deleted == ["a"]


def test_a_journaled_lapse_explains_a_duplicate_as_load() -> None:
    lines = [
        "0 recv a",
        "0 start a",
        "0 recv a",
        "0 lost a received_again",
        "0 start a",
        "0 done a",
        "0 done a",
        "0 deleted a",
    ]
    lines += [line for line in _clean_run() if line.split()[2] != "a"]
    result = analyse(_entries(*lines), SENT, killed=[])
    assert result.problems() == []
    assert result.load == {"a": 1}


def test_a_message_never_done_is_lost_and_unknown_ids_are_reported() -> None:
    lines = [line for line in _clean_run() if line != "0 done c"] + ["0 recv zzz"]
    problems = analyse(_entries(*lines), SENT, killed=[]).problems()
    assert any("never processed" in p and "'c'" in p for p in problems)
    assert any("never sent" in p and "zzz" in p for p in problems)


def test_journal_lines_from_several_writers_read_back(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    first, second = Journal(path, 0), Journal(path, 1)
    first.write("recv", "a")
    second.write("kill", "during_delete", "a", "b")
    first.close()
    second.close()
    entries = read_journal(path)
    assert [(e.worker, e.event, e.arg, e.extra) for e in entries] == [
        (0, "recv", "a", ()),
        (1, "kill", "during_delete", ("a", "b")),
    ]
    third = Journal(path, 2)
    with pytest.raises(ValueError, match="unknown journal event"):
        third.write("bogus")
    third.close()

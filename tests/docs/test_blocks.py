"""The machinery that runs the documentation's code blocks (tests/docs/blocks.py,
tests/docs/harness.py): every Python block is collected, a skip says why, and a
page that loses a message fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from leasekeeper import LeaseTooShort
from tests.docs.blocks import DOCS, DOCS_SYBIL, documented_pages
from tests.docs.harness import DocsHarness
from tests.docs.shell import ACCOUNTED, unaccounted_blocks

FENCE = re.compile(r"^[ \t>*+-]*(`{3,}|~{3,})[ \t]*(\S*)(.*)$", re.MULTILINE)


def python_fences(text: str) -> list[str]:
    """The info string of every fence that opens a Python block (by its language)."""
    found, open_fence = [], None
    for match in FENCE.finditer(text):
        fence, language, rest = match.groups()
        if open_fence is not None:
            if fence.startswith(open_fence) and not language:
                open_fence = None
            continue
        open_fence = fence
        if language.lower().strip("{.") in ("python", "py", "python3", "pycon", "py3"):
            found.append((language + rest).strip())
    return found


@pytest.mark.parametrize("page", documented_pages(), ids=lambda p: str(p.name))
def test_every_python_block_is_one_sybil_runs(page: Path) -> None:
    """A block spelled ```py, ```python3 or ```python title="x" would not be run."""
    fences = python_fences(page.read_text())
    assert [f for f in fences if f != "python"] == [], "spell a Python block ```python"
    document = DOCS_SYBIL.parse(page)
    visible = [e for e in document.examples() if page.read_text()[e.start :].startswith("```")]
    assert len(visible) == len(fences)


def run_page(tmp_path: Path, request: pytest.FixtureRequest, text: str) -> DocsHarness:
    """Run ``text`` as a documentation page would run, its checks included."""
    path = tmp_path / "page.md"
    path.write_text(text)
    document = DOCS_SYBIL.parse(path)
    harness = DocsHarness(request)
    document.namespace["harness"] = harness
    try:
        for example in document.examples():
            example.evaluate()
    finally:
        harness.finish()
    return harness


def test_a_skip_must_say_why(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- skip: next -->\n\n```python\nraise SystemExit\n```\n")
    with pytest.raises(ValueError, match="must say why"):
        DOCS_SYBIL.parse(page)


def test_a_page_that_processes_every_message_passes(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    harness = run_page(
        tmp_path,
        request,
        """
<!-- invisible-code-block: python
queue = harness.memory_queue(messages=3)
harness.interrupt_when_drained()
-->

```python
from leasekeeper import Worker

Worker(queue, handle).run()
```
""",
    )
    assert sorted(harness.processed) == ["job-1", "job-2", "job-3"]


def test_a_message_received_and_never_leased_fails_the_page(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with pytest.raises(AssertionError, match=r"1 message\(s\) .* still invisible"):
        run_page(
            tmp_path,
            request,
            """
<!-- invisible-code-block: python
queue = harness.memory_queue(messages=1)
-->

```python
[message] = queue.receive()
process(message.body)
```
""",
        )


def test_a_batch_leased_one_message_at_a_time_fails_when_the_first_job_is_slow(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The loop README.md had: receive 10, lease each only when its turn comes. While
    the first is processed the others are not renewed; a job longer than what is
    left of their visibility lets them lapse."""
    with pytest.raises(LeaseTooShort):
        run_page(
            tmp_path,
            request,
            """
<!-- invisible-code-block: python
from leasekeeper.testing import ManualClock
clock = ManualClock()
queue = harness.memory_queue(messages=3, visibility_timeout=30, clock=clock)
harness.slow_first_job(60, clock=clock)
-->

```python
from leasekeeper import LeaseManager

manager = LeaseManager(queue, visibility_timeout=60, clock=clock)
for message in queue.receive(max_messages=10):
    with manager.lease(message):
        process(message.body)
```
""",
        )


def test_the_same_batch_leased_at_receipt_passes(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    harness = run_page(
        tmp_path,
        request,
        """
<!-- invisible-code-block: python
from leasekeeper.testing import ManualClock
clock = ManualClock()
queue = harness.memory_queue(messages=3, visibility_timeout=30, clock=clock)
harness.slow_first_job(60, clock=clock)
-->

```python
from leasekeeper import LeaseManager

manager = LeaseManager(queue, visibility_timeout=60, clock=clock)
for held in manager.receive(max_messages=10):
    with held:
        process(held.message.body)
```
""",
    )
    assert sorted(harness.processed) == ["job-1", "job-2", "job-3"]


def test_the_operator_ends_a_loop_that_runs_until_interrupted(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    harness = run_page(
        tmp_path,
        request,
        """
<!-- invisible-code-block: python
queue = harness.memory_queue(messages=2)
harness.interrupt_when_drained()
-->

```python
from leasekeeper import LeaseManager

with LeaseManager(queue) as manager:
    while True:
        for message in queue.receive(max_messages=1, wait_seconds=0.05):
            with manager.lease(message):
                process(message.body)
```
""",
    )
    assert sorted(harness.processed) == ["job-1", "job-2"]


def test_a_block_that_processes_a_message_twice_fails(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with pytest.raises(AssertionError, match="processed more than once: job-1"):
        run_page(
            tmp_path,
            request,
            """
```python
process("job-1")
process("job-1")
```
""",
        )


# ------------------------------------------------------------------ shell blocks


@pytest.mark.parametrize("name", ACCOUNTED)
def test_every_shell_block_of_a_set_up_page_runs_or_says_why(name: str) -> None:
    """docs/installation.md and docs/local-development.md are followed as written:
    each ```sh block runs in the suite, or is marked with why it cannot."""
    assert unaccounted_blocks((DOCS / name).read_text()) == []


def test_shell_blocks_share_a_session_and_their_exports_reach_python(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    harness = run_page(
        tmp_path,
        request,
        """
<!-- shell: run -->
```sh
mkdir -p there && cd there
export GREETING="hello from the shell"
```

<!-- shell: run -->
```sh
test "$(basename "$PWD")" = there    # where the last block left off
echo "$GREETING" > said.txt
```

```python
import os
assert os.environ["GREETING"] == "hello from the shell"
```
""",
    )
    assert harness.processed == {}


def test_a_failing_shell_block_fails_with_its_output(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with pytest.raises(AssertionError, match=r"(?s)exited 3.*the reason it failed"):
        run_page(
            tmp_path,
            request,
            """
<!-- shell: run -->
```sh
echo "the reason it failed" >&2
exit 3
```
""",
        )


def test_a_served_block_starts_its_server_until_the_page_ends(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from tests.services import free_port

    port = free_port()
    run_page(
        tmp_path,
        request,
        f"""
<!-- shell: run, serves {port} -->
```sh
python -m http.server {port} --bind 127.0.0.1
python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/')"
```

```python
import urllib.request
assert urllib.request.urlopen("http://127.0.0.1:{port}/").status == 200
```
""",
    )
    import socket

    # Stopped with the page: nothing listens any more.
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 5):
        pass


def test_a_block_that_is_not_run_must_say_why(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- shell: not run -->\n```sh\ndocker run x\n```\n")
    with pytest.raises(ValueError, match="must say why"):
        DOCS_SYBIL.parse(page)

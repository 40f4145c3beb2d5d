"""The documentation: every public module in the API reference, every page in the
site's navigation, no link out of the repository, and the README's picture.

(``make test`` also builds the site with ``mkdocs build --strict``, which fails on
a broken link or anchor and on a reference to a module that does not exist.)"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "leasekeeper"
# Commands and helpers, not API: cli, demo and command.worker are `leasekeeper ...`
# (the guide documents the commands); decorator is the
# builder behind @leased and @manager.leased, documented there; leasekeeper.backends
# holds nothing but its modules, each with a page; the engine, the renewers, the
# receiving loop, the command and the integrations are packages whose __init__ only
# names the seam between their modules (their public modules have pages); Stats and
# WorkerStats (engine.stats, receiving.stats) are shown on the manager's and the
# worker's pages.
NOT_API = {
    "leasekeeper.engine.stats",
    "leasekeeper.receiving.stats",
    "leasekeeper.engine",
    "leasekeeper.renewers",
    "leasekeeper.receiving",
    "leasekeeper.command",
    "leasekeeper.integrations",
    "leasekeeper.command.cli",
    "leasekeeper.command.demo",
    "leasekeeper.command.worker",
    "leasekeeper.command.send",
    "leasekeeper.command.stats",
    "leasekeeper.decorator",
    "leasekeeper.backends",
    # The backends' own plumbing, public to one another, not to users: the URL
    # parser and entry points, the client read for another process (its Azure
    # credential too), SQS's lean path.
    "leasekeeper.backends.urls",
    "leasekeeper.backends.rebuild",
    "leasekeeper.backends.azure_identity",
    "leasekeeper.backends.environment",
    "leasekeeper.backends.sqs.lean",
    "leasekeeper.backends.sqs.sigv4",
    "leasekeeper.backends.sqs.keepalive",
}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)")


def public_modules() -> set[str]:
    found = set()
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(part.startswith("_") for part in parts[1:]):
            continue  # internal modules, and __main__
        found.add(".".join(parts))
    return found - NOT_API


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def nav_files(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [f for value in nav.values() for f in nav_files(value)]
    return [f for item in nav for f in nav_files(item)]


def test_every_public_module_is_in_the_api_reference() -> None:
    documented = set()
    for page in (DOCS / "reference").rglob("*.md"):
        documented |= set(re.findall(r"^::: (\S+)$", page.read_text(), re.MULTILINE))
    missing = {
        module
        for module in public_modules()
        if not any(module == d or module.startswith(d + ".") for d in documented - {"leasekeeper"})
        and module != "leasekeeper"
    }
    assert missing == set()
    assert "leasekeeper" in documented
    for name in ("otel", "prometheus", "observers", "errors", "config", "spark", "testing"):
        assert f"leasekeeper.{name}" in documented


def test_every_page_is_in_the_navigation_and_the_site_loads_nothing_from_outside() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = nav_files(config["nav"])
    assert sorted(listed) == sorted(str(p.relative_to(DOCS)) for p in pages())
    assert config["theme"]["name"] == "material"
    assert config["theme"]["font"] is False  # no web fonts fetched from elsewhere
    assert config["extra"]["generator"] is False  # no footer link to the theme's site
    assert "repo_url" not in config and "site_url" not in config


def test_no_link_in_the_docs_leaves_the_repository() -> None:
    outside = []
    for page in pages():
        text = page.read_text()
        targets = LINK.findall(text) + re.findall(r"<(https?://[^>]+)>", text)
        targets += re.findall(r"(?:href|src)=[\"']([^\"']+)", text)
        for target in targets:
            path = target.split("#")[0]
            resolved = (page.parent / path).resolve()
            scheme = re.match(r"[a-z][a-z0-9+.-]*:|//", target)
            if scheme or (path and not resolved.is_relative_to(DOCS)):
                outside.append(f"{page.relative_to(ROOT)}: {target}")
            elif path and not resolved.exists():
                outside.append(f"{page.relative_to(ROOT)}: {target} (missing)")
    assert outside == []


def test_the_readme_shows_the_demo_picture() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "](docs/img/demo.svg)" in readme
    root = ET.parse(DOCS / "img" / "demo.svg").getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    titles = [e.text for e in root.iter() if e.attrib.get("class") == "title"]
    assert titles == [
        "(a) long timeout, no leasekeeper",
        "(b) short timeout, no leasekeeper",
        "(c) short timeout + leasekeeper",
    ]


def test_the_site_works_from_disk_and_under_any_path() -> None:
    """Opened from disk (file://), search included, and served under a sub-path:
    the offline plugin inlines the search index, and its Web Worker runs through
    the iframe-worker shim shipped with the site (not fetched from a CDN); links
    are file paths; the theme's 404 page, whose links start at the server's root,
    is not built (mkdocs_hooks.py). Checked by hand in chromium: a search from
    file:///.../site/index.html?q=... lists its results, and none without the shim."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert "offline" in config["plugins"] and config["use_directory_urls"] is False
    for script in config["extra"]["polyfills"]:
        assert not re.match(r"[a-z]+:|/", script) and (DOCS / script).is_file()
    assert config["hooks"] == ["mkdocs_hooks.py"]
    assert "404.html" in (ROOT / "mkdocs_hooks.py").read_text()


def test_the_api_reference_shows_no_internal_module_and_leads_with_the_main_class() -> None:
    reference = (DOCS / "reference").rglob("*.md")
    shown = [m for page in reference for m in re.findall(r"^::: (\S+)", page.read_text(), re.M)]
    assert [m for m in shown if any(p.startswith("_") for p in m.split("."))] == []
    manager = (DOCS / "reference" / "manager.md").read_text()
    assert re.search(r"members:\s+- LeaseManager\s+- Stats", manager)


def test_the_home_page_code_is_whole_and_fits_its_box() -> None:
    """docs/index.md's example imports what it uses (its test runs it with nothing
    but the queue set up) and no line of it scrolls out of the code box."""
    text = (DOCS / "index.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert blocks, "the home page shows how it is used"
    for block in blocks:
        assert "import boto3" in block or "boto3" not in block
        assert max(len(line) for line in block.splitlines()) <= 79

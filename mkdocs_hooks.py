"""mkdocs hooks of the documentation site (mkdocs.yml, ``hooks:``).

The site must work under any path - opened from disk, or served from a sub-path
such as ``/leasekeeper/`` - so every link in it is relative. The theme's 404 page
cannot be: a server shows it at whatever depth the missing page was asked for, so
the theme writes its links from the site's root (``/assets/...``), which break
under a sub-path. The site ships no 404 page; a server shows its own.
"""

from __future__ import annotations

from typing import Any


def on_config(config: Any) -> Any:
    config.theme.static_templates.discard("404.html")
    return config

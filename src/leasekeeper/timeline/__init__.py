"""Timelines: which worker ran each job when, its renewals, crashes, re-deliveries
and duplicates - collected while it happens and drawn in a terminal or as SVG.

``leasekeeper demo`` draws its scenarios with these. ``Timeline`` and ``Run`` are
the data (``leasekeeper.timeline.model``), ``TimelineObserver`` adds a
``LeaseManager``'s renewals to one, ``render_text`` (``.text``) draws it with
characters and ``render_svg`` (``.svg``) as an SVG document.
"""

from leasekeeper.timeline.model import ENDINGS, Run, Timeline, TimelineObserver, lanes
from leasekeeper.timeline.svg import render_svg
from leasekeeper.timeline.text import legend, render_text

__all__ = [
    "ENDINGS",
    "Run",
    "Timeline",
    "TimelineObserver",
    "lanes",
    "legend",
    "render_svg",
    "render_text",
]

"""A job's recent runs as a small chart, drawn on the server as inline SVG.

Each run is a column, oldest on the left: its duration as a bar above the axis, its
lateness (how long after its slot it started) as a bar below, each scaled to the
largest of the runs shown, a run that failed (error, timeout, abandoned) in the error
colour with a mark above it, and a ``<title>`` that a browser shows on hover. No
script and no inline style: the colours are classes of admin.css, so the page's CSP
(headers.py: no script, styles from the page's origin only) holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from markupsafe import Markup, escape

from ..operations import display

__all__ = ["FAILED", "runs_chart"]

FAILED = frozenset({"error", "timeout", "abandoned"})
"""The run statuses the chart marks as failed."""

_WIDTH = 640
_PAD = 4
# The label line, then the duration half above the axis, the lateness half below it.
_LABEL = 14
_HALF = 56
_AXIS = _LABEL + _HALF + 4
_HEIGHT = _AXIS + _HALF + _LABEL + 2


def _scaled(value: int | None, largest: int) -> float:
    if not value or largest <= 0:
        return 0.0
    return round(value / largest * _HALF, 2)


def runs_chart(runs: Sequence[Mapping[str, Any]]) -> Markup | None:
    """The chart of ``runs`` (newest first, as runs.job_runs gives them; each with
    ``id``, ``status``, ``duration_ms`` and ``lateness_ms``) as an ``<svg>`` element
    (id ``runs-chart``); None when there is no run. Bars carry ``data-run``, the run's
    id, and the classes ``chart-duration`` or ``chart-lateness`` and ``chart-<status>``;
    a failed run (FAILED) has ``chart-error`` and a ``chart-failed`` mark."""
    if not runs:
        return None
    shown = list(reversed(runs))
    longest = max(run["duration_ms"] or 0 for run in shown)
    latest = max(run["lateness_ms"] or 0 for run in shown)
    slot = (_WIDTH - 2 * _PAD) / len(shown)
    width = round(max(1.0, slot * 0.7), 2)
    parts = [
        f'<svg id="runs-chart" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}" width="{_WIDTH}" height="{_HEIGHT}" '
        f'aria-label="duration and lateness of the last {len(shown)} runs, oldest first">',
        f'<text class="chart-label" x="{_PAD}" y="{_LABEL - 3}">duration '
        f"(up to {escape(display.milliseconds(longest))})</text>",
        f'<text class="chart-label" x="{_PAD}" y="{_HEIGHT - 3}">lateness '
        f"(up to {escape(display.milliseconds(latest))})</text>",
        f'<line class="chart-axis" x1="0" y1="{_AXIS}" x2="{_WIDTH}" y2="{_AXIS}"/>',
    ]
    for index, run in enumerate(shown):
        x = round(_PAD + index * slot + (slot - width) / 2, 2)
        status = str(run["status"])
        failed = status in FAILED
        classes = f"chart-{escape(status)}" + (" chart-error" if failed else "")
        title = escape(
            f"run {run['id']} {status}: {display.milliseconds(run['duration_ms']) or 'no duration'}"
            f", {display.milliseconds(run['lateness_ms']) or '0 ms'} late"
        )
        duration = _scaled(run["duration_ms"], longest)
        lateness = _scaled(run["lateness_ms"], latest)
        run_id = escape(str(run["id"]))
        parts.append(
            f'<rect class="chart-duration {classes}" data-run="{run_id}" x="{x}" '
            f'y="{round(_AXIS - duration, 2)}" width="{width}" height="{duration}">'
            f"<title>{title}</title></rect>"
        )
        parts.append(
            f'<rect class="chart-lateness {classes}" data-run="{run_id}" x="{x}" '
            f'y="{_AXIS}" width="{width}" height="{lateness}"><title>{title}</title></rect>'
        )
        if failed:
            centre = round(x + width / 2, 2)
            parts.append(
                f'<circle class="chart-failed" data-run="{run_id}" cx="{centre}" '
                f'cy="{round(_AXIS - duration - 4, 2)}" r="{min(3.0, max(1.0, width / 2))}">'
                f"<title>{title}</title></circle>"
            )
    parts.append("</svg>")
    return Markup("".join(parts))

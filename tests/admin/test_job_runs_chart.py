"""A job's page shows its recent runs as a small chart drawn on the server: an inline
SVG with each run's duration and lateness, errors marked, no script and no inline
style (the page's CSP allows neither)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest

from app.admin.chart import runs_chart
from app.admin.headers import ADMIN_HEADERS
from app.db import Database

from .conftest import Worker, execute, signed_in

SVG = "{http://www.w3.org/2000/svg}"


def _run(run_id: int, status: str, duration_ms: int | None, lateness_ms: int) -> dict[str, Any]:
    return {
        "id": run_id,
        "status": status,
        "duration_ms": duration_ms,
        "lateness_ms": lateness_ms,
        "manual": False,
    }


# Newest first, as job_runs gives them.
RUNS = [
    _run(4, "error", 10, 40),
    _run(3, "ok", 40, 0),
    _run(2, "running", None, 20),
    _run(1, "ok", 20, 10),
]


def _bars(svg: ET.Element, kind: str) -> dict[str, ET.Element]:
    return {
        bar.attrib["data-run"]: bar
        for bar in svg.iter(f"{SVG}rect")
        if f"chart-{kind}" in bar.attrib.get("class", "").split()
    }


def test_the_chart_draws_each_runs_duration_and_lateness_to_scale_oldest_first() -> None:
    svg = ET.fromstring(str(runs_chart(RUNS)))
    durations = _bars(svg, "duration")
    lateness = _bars(svg, "lateness")
    assert list(durations) == ["1", "2", "3", "4"]
    height = {run: float(bar.attrib["height"]) for run, bar in durations.items()}
    assert height["3"] == pytest.approx(2 * height["1"]) == pytest.approx(4 * height["4"])
    late = {run: float(bar.attrib["height"]) for run, bar in lateness.items()}
    assert late["4"] == pytest.approx(2 * late["2"]) == pytest.approx(4 * late["1"])
    assert late["3"] == 0
    xs = [float(bar.attrib["x"]) for bar in durations.values()]
    assert xs == sorted(xs)


def test_the_chart_marks_the_runs_that_failed() -> None:
    svg = ET.fromstring(str(runs_chart(RUNS)))
    marked = [
        mark.attrib["data-run"]
        for mark in svg.iter()
        if "chart-failed" in mark.attrib.get("class", "").split()
    ]
    assert marked == ["4"]
    assert "chart-error" in _bars(svg, "duration")["4"].attrib["class"].split()


def test_each_bar_tells_its_run_in_a_title_without_script_or_inline_style() -> None:
    drawn = str(runs_chart(RUNS))
    svg = ET.fromstring(drawn)
    titles = [title.text or "" for title in svg.iter(f"{SVG}title")]
    assert any("run 4" in title and "error" in title and "40 ms late" in title for title in titles)
    assert "<script" not in drawn and "style=" not in drawn and "<style" not in drawn


def test_no_runs_draw_no_chart() -> None:
    assert runs_chart([]) is None


async def test_the_job_page_shows_the_chart_of_its_runs_under_its_csp(
    database: Database, worker: Worker
) -> None:
    await execute(
        database,
        "INSERT INTO scheduler_jobs (id, name, trigger, next_run_at)"
        " VALUES ('nightly', 'Nightly sweep', 'every 900s', now())",
    )
    for run_id, status in ((1, "ok"), (2, "error")):
        await execute(
            database,
            "INSERT INTO scheduler_runs (id, job_id, scope, slot, started_at, finished_at,"
            " status, lateness_ms, duration_ms, pid, host) OVERRIDING SYSTEM VALUE"
            " VALUES (:id, 'nightly', 'leader', now(), now(), now(), :status, 5, 30, 1, 'h')",
            id=run_id,
            status=status,
        )
    async with worker() as client:
        base, _ = await signed_in(client)
        page = await client.get(f"{base}/jobs/nightly")
    assert page.headers["Content-Security-Policy"] == ADMIN_HEADERS["Content-Security-Policy"]
    start = page.text.index('<svg id="runs-chart"')
    svg = ET.fromstring(page.text[start : page.text.index("</svg>", start) + len("</svg>")])
    assert set(_bars(svg, "duration")) == {"1", "2"}
    assert "style=" not in page.text and "<script" not in page.text

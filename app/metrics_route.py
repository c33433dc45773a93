"""``GET /metrics``: the Prometheus scrape of the series in metrics.py, from every
worker (PROMETHEUS_MULTIPROC_DIR) or this one, and the outbox series read from the
database at scrape time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from .metrics import forget_dead_workers
from .operations.outboxes import outbox_summary
from .scheduler import Clock
from .scheduler.clock import lease_now

__all__ = ["PrometheusText", "router"]


class _OutboxCollector(Collector):
    def __init__(self, summary: list[dict[str, Any]]) -> None:
        self.summary = summary

    def collect(self) -> Iterator[GaugeMetricFamily]:
        messages = GaugeMetricFamily(
            "regent_outbox_messages",
            "Outbox rows waiting, by status (pending, scheduled: a delayed message not yet "
            "due, stuck)",
            labels=["outbox", "status"],
        )
        # Delivered rows are history, the last hour's too: their per-minute counts, so
        # that a scrape costs what the live work costs.
        delivered = GaugeMetricFamily(
            "regent_outbox_delivered_last_hour",
            "Outbox rows delivered in the last hour, to the minute (counted as delivered)",
            labels=["outbox"],
        )
        oldest = GaugeMetricFamily(
            "regent_outbox_oldest_pending_seconds",
            "Age of the oldest pending row",
            labels=["outbox"],
        )
        for entry in self.summary:
            for status in ("pending", "scheduled", "stuck"):
                messages.add_metric([entry["name"], status], entry["counts"][status])
            delivered.add_metric([entry["name"]], entry["counts"]["delivered"])
            oldest.add_metric([entry["name"]], entry["oldest_pending_seconds"] or 0.0)
        yield messages
        yield delivered
        yield oldest


class PrometheusText(Response):
    """The Prometheus text exposition format, version 0.0.4: the one every Prometheus
    server scrapes (the series' names need nothing of the newer formats)."""

    media_type = CONTENT_TYPE_PLAIN_0_0_4


router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=PrometheusText)
async def metrics(request: Request) -> Response:
    """Prometheus text: job, leader and loop series from every worker; outbox series from
    the database."""
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        forget_dead_workers(os.environ["PROMETHEUS_MULTIPROC_DIR"])
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        body = generate_latest(registry)
    else:
        body = generate_latest(REGISTRY)
    clock: Clock = request.app.state.clock
    summary = await outbox_summary(request.app.state.database.engine, lease_now(clock))
    outboxes = CollectorRegistry()
    outboxes.register(_OutboxCollector(summary))
    return PrometheusText(body + generate_latest(outboxes))

"""Every HTTP route of the default app, taken from its own route table, against hostile
input: numbers past every column type, NUL bytes, lone surrogates, huge bodies, wrong
types. No answer is a 5xx or shows a traceback, nothing is written, and the schedule
still fires afterwards. A route added later is covered without editing this file.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import params
from fastapi.routing import APIRoute, iter_route_contexts
from sqlalchemy import text

from app.db import Database

from .conftest import AUTH, Hostile

# Hostile values as they travel in a URL (already percent-encoded where needed).
URL_VALUES = [
    str(2**63),
    str(2**64),
    str(-(2**63) - 1),
    "1" + "0" * 400,
    "-1",
    "0",
    "1e400",
    "NaN",
    "inf",
    "%00",
    "a%00b",
    "%ED%A0%80",
    "%FF%FE",
    "%C0%AF",
    "..%2F..%2Fetc",
    "x" * 5000,
    "'%3B DROP TABLE scheduler_jobs%3B--",
    "%7B%7B7*7%7D%7D",
    "%3Cscript%3E",
    "%20",
]

# Hostile JSON values: every JSON type, the numbers and strings the database refuses.
JSON_VALUES: list[Any] = [
    2**31,
    2**63,
    2**64,
    -(2**63) - 1,
    10**400,
    -1,
    0,
    1.5,
    True,
    None,
    "",
    "\x00",
    "a\x00b",
    "\ud800",
    "\udfff x",
    "x" * 100_000,
    [],
    [1, 2],
    {},
    {"nested": {"deeper": [None]}},
]

RAW_BODIES = [
    b"",
    b"{",
    b"null",
    b"[]",
    b'"\\ud800"',
    b'{"a": "\\u0000"}',
    b"\xff\xfe\x00",
    b'{"x": "' + b"y" * 2_000_000 + b'"}',
    b"[" * 5000 + b"]" * 5000,
]

# Random unicode, from a fixed seed: the same examples on every run.
_RANDOM = random.Random(20261202)
RANDOM_TEXT = [
    "".join(chr(_RANDOM.randrange(0, 0x110000)) for _ in range(_RANDOM.randrange(1, 40)))
    for _ in range(20)
]

TRACEBACK = re.compile(r"Traceback \(most recent call last\)|File \"[^\"]+\", line \d+")


@dataclass
class Probe:
    """One request to send: which surface it belongs to, and how."""

    surface: str
    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None
    data: dict[str, str] | None = None


def _json(value: Any) -> bytes:
    # Python's json writes a lone surrogate as the escape "\ud800", exactly as a client
    # would send it.
    return json.dumps(value).encode()


def _surface(path: str) -> str:
    return "admin" if path.startswith("/admin") else "public"


def _probes_for(
    path: str, methods: set[str], route: Any, csrf: str, known: dict[str, str]
) -> Iterator[Probe]:
    dependant = route.dependant if isinstance(route, APIRoute) else None
    names = re.findall(r"{([^}:]+)(?::[^}]*)?}", path)
    surface = _surface(path)
    # The other path parameters name rows that exist, so the hostile one is what the
    # handler meets (an unknown outbox would answer 404 before a bad message id is read).
    benign = {name: known.get(name, "1") for name in names}

    def url(values: dict[str, str], query: str = "") -> str:
        filled = path
        for name in names:
            filled = re.sub(r"{" + name + r"(?::[^}]*)?}", values[name], filled)
        return filled + (f"?{query}" if query else "")

    queries = [q.alias for q in dependant.query_params] if dependant else ["q"]
    body = dependant.body_params if dependant else []
    form = [p.alias for p in body if isinstance(p.field_info, params.Form)]
    has_json_body = bool(body) and not form
    for method in sorted(methods - {"HEAD"}):
        for auth in ({}, AUTH):
            for value in URL_VALUES:
                targets = [{**benign, name: value} for name in names] or [benign]
                for values in targets:
                    query = "&".join(f"{name}={value}" for name in queries)
                    # A form's CSRF field is right where a path is hostile, so the hostile
                    # value reaches the handler; elsewhere the field itself is hostile.
                    token = csrf if names else value
                    data = {name: token if name == "csrf" else value for name in form}
                    yield Probe(surface, method, url(values, query), auth, data=data or None)
            if has_json_body:
                for raw in RAW_BODIES:
                    yield Probe(surface, method, url(benign), auth | _JSON, content=raw)
                fields = [p.alias for p in body]
                shape = _sample_body(body)
                for name in fields:
                    for value in JSON_VALUES + RANDOM_TEXT:
                        hostile = _json(shape | {name: value})
                        yield Probe(surface, method, url(benign), auth | _JSON, content=hostile)


_JSON = {"Content-Type": "application/json"}


def _sample_body(body: list[Any]) -> dict[str, Any]:
    """A well-typed body to vary one field of at a time (a sole model's fields are the
    top level, as FastAPI reads it). Its ids are 999, which names no row, so a hostile
    value that slipped past validation would show as a write."""
    fields = [p.alias for p in body]
    if len(body) == 1 and hasattr(body[0].field_info.annotation, "model_fields"):
        fields = list(body[0].field_info.annotation.model_fields)
    return {name: 999 if name.endswith(("_id", "amount")) else "fuzz-1" for name in fields}


def probes(hostile: Hostile, known: dict[str, str]) -> list[Probe]:
    """Every probe for every route in the app's route table."""
    found: list[Probe] = []
    for context in iter_route_contexts(hostile.app.router.routes):
        path, methods = context.path, context.methods
        if path is None or not methods:
            continue
        found += _probes_for(path, set(methods), context.original_route, hostile.csrf, known)
    return found


async def _known(database: Database) -> dict[str, str]:
    """Path parameter values that name existing rows, by parameter name."""
    async with database.engine.connect() as conn:
        job = (await conn.execute(text("SELECT min(id) FROM scheduler_jobs"))).scalar_one()
        message = (
            await conn.execute(text("SELECT id, outbox FROM outbox_messages ORDER BY id"))
        ).first()
    assert job is not None and message is not None
    return {"job_id": job, "name": message.outbox, "message_id": str(message.id)}


async def _snapshot(database: Database) -> dict[str, Any]:
    """What hostile input must not change: the jobs' identity and pause state, every
    outbox row, every grant, and the admin session state."""
    async with database.engine.connect() as conn:
        return {
            "jobs": (
                await conn.execute(
                    text("SELECT id, name, trigger, paused FROM scheduler_jobs ORDER BY id")
                )
            ).all(),
            "outbox": (
                await conn.execute(
                    text(
                        "SELECT id, outbox, key, payload::text, status, attempts, last_error"
                        " FROM outbox_messages ORDER BY id"
                    )
                )
            ).all(),
            "grants": (await conn.execute(text("SELECT * FROM credit_grants ORDER BY id"))).all(),
            "workspaces": (await conn.execute(text("SELECT * FROM workspaces ORDER BY id"))).all(),
            "sessions": (
                await conn.execute(text("SELECT * FROM admin_sessions ORDER BY id"))
            ).all(),
        }


async def test_hostile_input_on_every_route_gets_no_5xx_and_writes_nothing(
    hostile: Hostile, database: Database, record_property: Any
) -> None:
    before = await _snapshot(database)
    sent: Counter[str] = Counter()
    failures = []
    known = await _known(database) | {"sid": hostile.sid}
    for probe in probes(hostile, known):
        response = await hostile.client.request(
            probe.method, probe.url, headers=probe.headers, content=probe.content, data=probe.data
        )
        sent[probe.surface] += 1
        body = response.text
        if response.status_code >= 500 or TRACEBACK.search(body):
            failures.append(f"{probe.method} {probe.url[:120]} -> {response.status_code}")
    record_property("inputs_per_surface", dict(sent))
    assert not failures, "\n".join(failures[:40])
    assert await _snapshot(database) == before
    assert sent["admin"] > 500 and sent["public"] > 400, sent
    await _the_schedule_still_fires(hostile, database)


async def _the_schedule_still_fires(hostile: Hostile, database: Database) -> None:
    queued = await hostile.client.post("/admin/api/jobs/report_warm/run", headers=AUTH)
    assert queued.status_code == 202, queued.text
    async with asyncio.timeout(30):
        while True:
            async with database.engine.connect() as conn:
                ran = (
                    await conn.execute(
                        text(
                            "SELECT count(*) FROM scheduler_runs"
                            " WHERE job_id = 'report_warm' AND status = 'ok'"
                        )
                    )
                ).scalar_one()
            if ran:
                return
            await asyncio.sleep(0.05)


def test_the_route_table_is_what_the_fuzzer_covers(hostile_settings: Any) -> None:
    """Guards the harness: every route of the app yields probes, none is skipped."""
    from app.jobs import build
    from app.main import create_app

    jobs = build(hostile_settings)
    app = create_app(hostile_settings, jobs.scheduler)
    app.include_router(jobs.router)
    covered = {
        context.path
        for context in iter_route_contexts(app.router.routes)
        if context.path is not None
        and list(
            _probes_for(context.path, set(context.methods or ()), context.original_route, "c", {})
        )
    }
    assert {
        "/api/stats",
        "/api/credits/grants",
        "/admin/api/outboxes/{name}/messages/{message_id}/reset",
        "/admin/s/{sid}/jobs/{job_id}/run",
        "/admin/login",
    } <= covered
    assert len(covered) >= 20


pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

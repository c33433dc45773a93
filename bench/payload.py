"""What checking a payload at enqueue costs, beside the json.dumps it cannot do without.

For each shape, the median of ``dump_payload`` (the outbox's check and encoding) and of
a plain ``json.dumps`` of the same payload, in one run, and their ratio: the check's
overhead is the ratio less one.

    python bench/payload.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from app.outbox.payload import dump_payload

SHAPES: dict[str, Any] = {
    "reminder (5 fields)": {
        "user_id": 42,
        "template": "reminder",
        "at": "2026-01-01T09:00:00+01:00",
        "vars": {"name": "Ada", "slot": "9:00"},
    },
    "order, 200 lines": {
        "order": 7,
        "lines": [{"sku": f"sku-{n}", "qty": n % 5 + 1, "tags": ["a", "b"]} for n in range(200)],
    },
    "export, 100k records": {
        "records": [
            {"id": n, "name": "Zoë [x]", "attrs": {"a": 1, "b": [1, 2, 3]}} for n in range(100_000)
        ]
    },
    # Every record with a float of 1e16 or more (written 1e+16 by json.dumps): the
    # exact path, which rewrites each in positional form for jsonb.
    "export, 100k big floats": {
        "records": [
            {"id": n, "name": "Zoë [x]", "amount": 1.5e20 * n + 1e16} for n in range(100_000)
        ]
    },
}


def _median(call: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(f"{'payload':<24}{'json.dumps':>14}{'dump_payload':>16}{'ratio':>8}")
    for name, payload in SHAPES.items():
        # Small payloads are timed in batches, so that the clock's grain does not count.
        batch = 1 if name.startswith("export") else 2000
        plain = _median(
            lambda p=payload, n=batch: [json.dumps(p, ensure_ascii=False) for _ in range(n)],
            args.repeat,
        )
        checked = _median(
            lambda p=payload, n=batch: [dump_payload("bench", p) for _ in range(n)], args.repeat
        )
        print(
            f"{name:<24}{plain / batch * 1e3:>11.3f} ms{checked / batch * 1e3:>13.3f} ms"
            f"{checked / plain:>7.2f}x"
        )


if __name__ == "__main__":
    main()

"""What showing data safely costs: app.printable over a million characters of several
kinds of text, beside repr() of the same text (C speed, which escapes too) in the same
run. Run: python bench/printable.py"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from app.printable import printable, printable_name, printable_text

TEXTS = {
    "ascii": "invoice-42 for alice " * 50_000,
    "cyrillic": "счёт-42 для алисы " * 55_000,
    "cjk": "请求付款四十二号 " * 110_000,
    "emoji": "paid \U0001f600 " * 125_000,
    "zero-width every 10": "invoice-42\u200b" * 90_000,
}


def _median_ms(shown: Callable[[str], object], text: str) -> float:
    times = []
    for _ in range(5):
        started = time.perf_counter()
        shown(text)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    printable("warm")  # the character class is built on first use
    print(f"{'text':<22}{'repr ms':>9}{'printable':>11}{'_text':>9}{'_name':>9}{'ratio':>8}")
    for name, text in TEXTS.items():
        base = _median_ms(repr, text)
        ours = _median_ms(printable, text)
        in_text = _median_ms(printable_text, text)
        as_name = _median_ms(printable_name, text)
        row = f"{name:<22}{base:>9.1f}{ours:>11.1f}{in_text:>9.1f}{as_name:>9.1f}"
        print(f"{row}{ours / base:>7.2f}x")


if __name__ == "__main__":
    main()

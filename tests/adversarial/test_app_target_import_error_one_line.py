"""A bad --app fails in one line naming it, also when importing it raises an error
whose message spans lines (a pydantic ValidationError of the user's own settings)."""

import os
import subprocess
import sys
from pathlib import Path

USER_APP = """
from pydantic import BaseModel


class MySettings(BaseModel):
    SMS_GATEWAY_URL: str


settings = MySettings()  # the variable is unset: ValidationError at import
app = None
"""


def test_an_app_whose_import_raises_a_multi_line_error_fails_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "main.py").write_text(USER_APP)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    target = "mypkg.main:app"
    result = subprocess.run(
        [sys.executable, "-m", "app", "--app", target],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert target in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr

"""--app is honoured wherever the command line puts it: `python -m app --app X serve`
serves X (or refuses a bad X), as `python -m app --app X` and `serve --app X` do."""

import pytest

from app.__main__ import _app_target, _parser
from app.app_target import AppTargetError
from app.settings import load_settings


def test_a_bad_app_given_before_serve_is_refused_not_replaced_by_the_built_in_app() -> None:
    args = _parser().parse_args(["--app", "nosuch_module:app", "serve"])
    with pytest.raises(AppTargetError, match="nosuch_module:app"):
        _app_target(args, load_settings(_env_file=None))

"""An ``Outbox(...)`` refused at the call leaves nothing behind: ``scheduler=`` that is
not a Scheduler is refused with OutboxArgumentError naming ``scheduler`` (not an
AttributeError from inside the registration), and a refused outbox never takes its
name from the live outbox the app drains (which the app binds at start-up)."""

from __future__ import annotations

import pytest

from app.outbox import Message, Outbox, OutboxArgumentError
from app.scheduler import InvalidJobError, Scheduler


async def _deliver(message: Message) -> None:
    """A receiver never called: nothing is delivered."""


@pytest.mark.parametrize("scheduler", [5, "default", object()], ids=["int", "text", "object"])
def test_an_outbox_refuses_a_scheduler_that_is_not_one(scheduler: object) -> None:
    with pytest.raises(OutboxArgumentError) as refused:
        Outbox("misplaced", _deliver, scheduler=scheduler)  # type: ignore[arg-type]
    assert refused.value.argument == "scheduler"
    assert all(live.name != "misplaced" for live in Outbox.live())


def test_an_outbox_refused_by_its_scheduler_leaves_the_live_one_of_its_name() -> None:
    scheduler = Scheduler()
    drained = Outbox("mails", _deliver, scheduler=scheduler)
    with pytest.raises(InvalidJobError, match="already registered"):
        Outbox("mails", _deliver, scheduler=scheduler)
    assert [live for live in Outbox.live() if live.name == "mails"] == [drained]

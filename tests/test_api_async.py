"""``chatstream.api`` from async code where the sync doors are tested elsewhere (test_api.py,
test_edits.py, test_revocation.py): ``aedit``, ``astop_replies_of``, and ``astream`` of a reply
that is no longer there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from chatstream import api
from chatstream.models import Generation, Message
from chatstream.testing import DEFAULT_TEXT

pytestmark = pytest.mark.django_db(transaction=True)

Status = Generation.Status


@pytest.fixture
def user(make_user: Callable[..., Any]) -> Any:
    return make_user()


async def test_aedit_sends_a_new_version_of_the_question_and_runs_it(user, simulator):
    first = await api.arun(await api.asend(user, "One", model="fast"))
    message = await Message.objects.aget(pk=first.prompt_message_id)

    edited = await api.aedit(message, "One, again")

    assert edited.status == Status.PENDING
    assert edited.prompt_message.edit_of_id == message.pk
    assert edited.prompt_message.content == "One, again"
    assert edited.upstream_messages[-1] == {"role": "user", "content": "One, again"}
    finished = await api.arun(edited)
    assert (finished.status, finished.content) == (Status.COMPLETED, DEFAULT_TEXT)
    assert simulator.requests[-1].body["messages"][-1]["content"] == "One, again"


async def test_astop_replies_of_cancels_the_users_replies_and_no_one_elses(
        user, make_user, simulator):
    mine = await api.asend(user, "Hi", model="fast")
    theirs = await api.asend(await make_user_async(make_user, "bob"), "Hi", model="fast")

    assert await api.astop_replies_of(user) == 1

    mine = await Generation.objects.aget(pk=mine.pk)
    assert mine.status == Status.CANCELLED
    assert (await api.arun(mine)).status == Status.CANCELLED  # it never starts
    assert simulator.requests == []
    assert (await Generation.objects.aget(pk=theirs.pk)).status == Status.PENDING
    assert await api.astop_replies_of(user) == 0  # nothing live is left


async def test_astream_of_a_reply_deleted_meanwhile_raises_does_not_exist(user, simulator):
    generation = await api.asend(user, "Hi", model="fast")
    await Generation.objects.filter(pk=generation.pk).adelete()

    with pytest.raises(Generation.DoesNotExist):
        async for _ in api.astream(generation):
            pass
    assert simulator.requests == []


async def make_user_async(make_user: Callable[..., Any], username: str) -> Any:
    from asgiref.sync import sync_to_async

    return await sync_to_async(make_user)(username)

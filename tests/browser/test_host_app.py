"""The example host site's command (tests/hostapp) in Chromium: a reply started by
``manage.py hostapp_ask`` in a process of its own, shown live by the page, and stopped from it."""

from __future__ import annotations

import itertools
import re

import pytest

from chatstream.models import Generation

from ..test_host_app import across_processes, ask, billed, charge_of, host_site, started_by
from .conftest import expect, record_stream, streamed_states

__all__ = ["across_processes", "ask", "billed", "host_site"]  # fixtures, used by name

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_page_shows_a_reply_the_command_runs_as_it_grows(
        page, user, simulator, host_site, across_processes, billed, ask):
    host_site("default?tps=12&tokens=60&first_token_delay=0.3")  # about 5 s
    command = ask(user.username, "When are you open?")
    generation = started_by(command, simulator)
    page.goto(generation.conversation.get_absolute_url())
    record_stream(page)
    live = page.locator(".cs-live")
    expect(live.locator('[aria-live="polite"]')).to_have_text(re.compile(r"\S"))
    assert command.running(), "the page showed text only after the command had ended"
    final = page.locator(".cs-assistant.cs-completed")
    expect(final).to_be_visible(timeout=20_000)
    code, out, err = command.wait()
    assert code == 0 and out.splitlines()[-1] == "status: completed", err
    generation.refresh_from_db()
    assert generation.status == "completed"
    assert generation.worker.endswith(f":{command.process.pid}")
    states = streamed_states(page, generation.content)
    assert len([s for s in states if len(s) < len(generation.content)]) >= 3, states
    for before, after in itertools.pairwise(states):
        assert after.startswith(before)
    assert len(simulator.requests) == 1
    assert charge_of(generation).status == "completed" and billed == []


def test_stop_on_the_page_stops_the_commands_reply(
        page, user, simulator, host_site, across_processes, billed, ask):
    host_site("default?tps=5&tokens=300")  # a minute, unless stopped
    command = ask(user.username, "Tell me everything.")
    generation = started_by(command, simulator)
    page.goto(generation.conversation.get_absolute_url())
    live = page.locator(".cs-live")
    expect(live.locator('[aria-live="polite"]')).to_have_text(re.compile(r"\S"))
    live.get_by_role("button", name="Stop").click()
    expect(page.locator(".cs-assistant.cs-cancelled")).to_be_visible(timeout=15_000)
    code, out, _err = command.wait(timeout=20)
    assert code == 1 and out.splitlines()[-1] == "status: cancelled"
    assert Generation.objects.get(pk=generation.pk).status == "cancelled"
    assert simulator.requests[0].client_closed
    assert charge_of(generation).status == "cancelled"

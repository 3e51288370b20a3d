"""Tool calls on the chat page in headless Chromium: cards as the calls run, a call that needs
approval decided from the keyboard, and the reply going on in its next step."""

from __future__ import annotations

from typing import Any

import pytest

from chatstream.models import Generation, ToolCall
from tests.test_tool_loop import TOOLS, ran

from .conftest import expect, screenshot, send, start_conversation

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def asking(settings: Any) -> None:
    ran.clear()
    settings.CHATSTREAM_MODELS = {"agent": {
        "PROVIDER": "default", "MODEL": "agent",
        "TOOLS": [TOOLS[0], "tests.tools_approval.get_time"]}}


def test_a_call_approved_from_the_keyboard_runs_and_the_reply_goes_on(page, simulator):
    start_conversation(page)
    send(page, "Weather and time in Paris?")
    cards = page.locator(".cs-toolcall")
    expect(cards).to_have_count(2, timeout=15_000)
    asking = page.locator('.cs-toolcall[data-status="pending_approval"]')
    expect(asking).to_have_count(1)
    expect(asking.locator(".cs-toolcall-arguments")).to_have_text(
        '{"timezone": "Europe/Paris"}')  # what the user approves, unfolded
    expect(page.locator(".cs-waiting")).to_contain_text("Waiting for your decision")
    screenshot(page, "tool-call-waiting")
    assert ran == [] and len(simulator.requests) == 1

    approve = asking.get_by_role("button", name="Approve")
    approve.focus()
    page.keyboard.press("Enter")
    expect(page.locator('.cs-toolcall[data-status="succeeded"]')).to_have_count(2,
                                                                             timeout=15_000)
    final = page.locator(".cs-assistant.cs-completed", has_text="Results:")
    expect(final).to_contain_text("| 12:00", timeout=15_000)
    expect(page.locator(".cs-waiting")).to_have_count(0)
    expect(page.locator("[sse-connect]")).to_have_count(0)
    screenshot(page, "tool-call-answered", full_page=True)
    assert ToolCall.objects.get(name="get_time").decided_by is not None
    assert Generation.objects.filter(step=2, status="completed").count() == 1

    page.reload()  # the same cards and answer, from the database
    expect(page.locator(".cs-toolcall")).to_have_count(2)
    expect(page.locator(".cs-toolcall-decision")).to_have_count(0)
    expect(page.locator(".cs-assistant", has_text="Results:")).to_have_count(1)


def test_a_decision_taken_elsewhere_is_said_on_a_page_that_still_offers_it(new_page, simulator):
    first = new_page()
    url = start_conversation(first)
    send(first, "Weather and time in Paris?")
    expect(first.locator('.cs-toolcall[data-status="pending_approval"]')).to_have_count(
        1, timeout=15_000)
    second = new_page()
    second.goto(url)
    expect(second.get_by_role("button", name="Deny")).to_be_visible()
    first.get_by_role("button", name="Approve").click()
    expect(first.locator(".cs-assistant", has_text="Results:")).to_contain_text(
        "| 12:00", timeout=15_000)
    second.get_by_role("button", name="Deny").click()  # this page still offers it
    expect(second.locator("#cs-notice")).to_contain_text("already decided")
    assert ToolCall.objects.get(name="get_time").status == "succeeded"

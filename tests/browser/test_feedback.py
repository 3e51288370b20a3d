"""Feedback on a reply in Chromium: thumbs that toggle, a comment, a reload, the keyboard."""

from __future__ import annotations

import pytest

from chatstream.models import Feedback

from .conftest import expect, screenshot, send, start_conversation

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def focused_id(page) -> str:
    return str(page.evaluate("document.activeElement && document.activeElement.id"))


def test_rate_up_change_to_down_comment_and_reload_keeps_it(page, simulator, use_model):
    use_model("fast")
    start_conversation(page)
    send(page, "Hello")
    reply = page.locator(".cs-assistant.cs-completed")
    expect(reply).to_be_visible(timeout=15_000)
    good = reply.get_by_role("button", name="Good reply")
    bad = reply.get_by_role("button", name="Bad reply")
    expect(good).to_have_attribute("aria-pressed", "false")
    expect(reply.get_by_text("Add a comment")).to_have_count(0)

    good.click()
    expect(good).to_have_attribute("aria-pressed", "true")
    expect(bad).to_have_attribute("aria-pressed", "false")
    bad.click()
    expect(bad).to_have_attribute("aria-pressed", "true")
    expect(good).to_have_attribute("aria-pressed", "false")

    reply.get_by_text("Add a comment").click()
    box = reply.get_by_role("textbox", name="What made this reply good or bad? (optional)")
    box.fill("It did not answer the question.")
    reply.get_by_role("button", name="Save comment").click()
    expect(reply.get_by_role("status")).to_have_text("Your comment was saved.")
    expect(page.locator(".cs-flash")).to_have_count(0)  # all in place: no page loaded
    screenshot(page, "feedback-comment")
    feedback = Feedback.objects.get()
    assert (feedback.rating, feedback.comment) == (Feedback.Rating.BAD,
                                                   "It did not answer the question.")

    page.reload()
    reply = page.locator(".cs-assistant.cs-completed")
    expect(reply.get_by_role("button", name="Bad reply")).to_have_attribute("aria-pressed",
                                                                            "true")
    expect(reply.get_by_role("button", name="Good reply")).to_have_attribute("aria-pressed",
                                                                             "false")
    reply.get_by_text("Your comment").click()
    expect(reply.get_by_role("textbox")).to_have_value("It did not answer the question.")


def test_thumbs_work_from_the_keyboard_and_keep_the_focus(page, simulator, use_model):
    use_model("fast")
    start_conversation(page)
    send(page, "Hello")
    reply = page.locator(".cs-assistant.cs-completed")
    expect(reply).to_be_visible(timeout=15_000)
    good = reply.get_by_role("button", name="Good reply")
    good.focus()
    page.keyboard.press("Enter")
    expect(good).to_have_attribute("aria-pressed", "true")
    good_id = good.get_attribute("id")
    assert focused_id(page) == good_id  # the new controls, the same button
    page.keyboard.press("Tab")
    assert focused_id(page).endswith("-bad")
    page.keyboard.press("Space")
    bad = reply.get_by_role("button", name="Bad reply")
    expect(bad).to_have_attribute("aria-pressed", "true")
    assert focused_id(page).endswith("-bad")
    page.keyboard.press("Space")  # pressed again: taken back
    expect(bad).to_have_attribute("aria-pressed", "false")
    expect(good).to_have_attribute("aria-pressed", "false")
    expect(reply.get_by_role("status")).to_have_text("Your rating was taken back.")
    assert not Feedback.objects.exists()
    # The comment is reached by the keyboard too.
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Enter")
    expect(good).to_have_attribute("aria-pressed", "true")
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert focused_id(page).endswith("-more")
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    page.keyboard.type("Clear and short.")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    expect(reply.get_by_role("status")).to_have_text("Your comment was saved.")
    assert Feedback.objects.get().comment == "Clear and short."
    expect(page.locator(".cs-flash")).to_have_count(0)  # all in place: no page loaded

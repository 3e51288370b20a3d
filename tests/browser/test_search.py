"""Conversation search in Chromium: results as the user types, the keyboard, no page load."""

from __future__ import annotations

import pytest

from chatstream.models import Conversation, Message

from .conftest import expect, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_typing_in_the_search_box_shows_the_results_in_place(page, user):
    teapot = Conversation.objects.create(user=user, title="Kitchen things")
    Message.objects.create(conversation=teapot, role="user",
                           content="Where did I put the <b>teapot</b>?")
    Conversation.objects.create(user=user, title="Garden")
    page.goto("/chat/")
    expect(page.locator(".cs-conversation-link")).to_have_count(2)
    page.evaluate("window.csLoaded = 'same page'")  # gone if a page loads

    box = page.get_by_role("searchbox", name="Search your conversations")
    box.focus()
    page.keyboard.type("teapot")
    results = page.locator("#cs-results")
    expect(results).to_have_attribute("aria-live", "polite")
    expect(results.locator("mark")).to_have_text("teapot", timeout=5_000)
    expect(results.locator(".cs-conversation-link")).to_have_count(1)
    expect(results).to_contain_text("<b>teapot</b>")  # the user's text, shown as text
    assert page.evaluate("window.csLoaded") == "same page"
    assert page.url.endswith("/chat/search/?q=teapot")
    expect(box).to_be_focused()
    screenshot(page, "search-results")

    page.keyboard.press("Tab")  # the Search button, then the result
    page.keyboard.press("Tab")
    expect(results.locator(".cs-conversation-link")).to_be_focused()
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/chat/c/{teapot.pk}/**")

    page.go_back()
    expect(page.locator("h1")).to_have_text("Conversations")  # the page, not the region
    box = page.get_by_role("searchbox", name="Search your conversations")
    box.fill("")  # no query: the whole list again
    expect(page.locator("#cs-results .cs-conversation-link")).to_have_count(2, timeout=5_000)


def test_a_too_long_query_says_so_in_place(page, user):
    page.goto("/chat/")
    box = page.get_by_role("searchbox", name="Search your conversations")
    box.evaluate("(el) => el.removeAttribute('maxlength')")
    box.fill("y" * 201)
    expect(page.get_by_role("alert")).to_contain_text("at most 200 characters", timeout=5_000)

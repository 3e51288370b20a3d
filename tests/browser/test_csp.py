"""The demo sends a strict Content-Security-Policy (Django 6+); no page may break it."""

from __future__ import annotations

import django
import pytest

from .conftest import expect, send, start_conversation

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(django.VERSION < (6, 0), reason="Django 5.2 has no CSP middleware"),
]


@pytest.fixture
def user(make_user):
    """A superuser, so the admin pages can be visited too."""
    return make_user("root", is_staff=True, is_superuser=True)


def test_chat_and_admin_pages_run_under_a_strict_csp(page, site, simulator, use_model):
    use_model("fast")
    response = page.goto("/chat/")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    start_conversation(page)
    send(page, "Hello <b>there</b>")
    expect(page.locator(".cs-assistant.cs-completed")).to_be_visible(timeout=15_000)
    for url in ("/admin/", "/admin/chatstream/generation/",
                "/admin/chatstream/generation/summary/", "/admin/chatstream/conversation/"):
        assert page.goto(url).status == 200, url
    page.goto("/admin/chatstream/generation/")
    page.locator("#result_list tbody tr a").first.click()
    expect(page.locator("body")).to_contain_text("Sure")
    # The fixture fails the test on any CSP violation reported in the console.

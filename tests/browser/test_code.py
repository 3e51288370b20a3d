"""Code blocks in a reply: highlighted on the server, labelled, copied exactly with their own
button; the whole reply copied with its own; light and dark colours; all under the demo's
strict Content-Security-Policy (the page fixture fails a test on any violation)."""

from __future__ import annotations

from typing import Any

import django
import pytest

from chatstream.testing import Script

from .conftest import expect, screenshot, send, start_conversation

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CODE = 'def greet(name):\n    return f"Hello, {name}!"\n'
TEXT = (f"Two blocks.\n\n```python\n{CODE}```\n\nAnd one without a language:\n\n"
        "```\necho <b>hi</b>\n```\n\nThe end.")
CLIPBOARD = ["clipboard-read", "clipboard-write"]
KEYWORD_LIGHT = "rgb(169, 13, 145)"  # Pygments' xcode: #a90d91
KEYWORD_DARK = "rgb(255, 123, 114)"  # Pygments' github-dark: #ff7b72


def _reply(page: Any, simulator: Any, use_model: Any, text: str = TEXT) -> Any:
    simulator.register("code", Script(text=text, tokens_per_second=0, first_token_delay=0))
    use_model("code")
    response = page.goto("/chat/")
    if django.VERSION >= (6, 0):
        assert "script-src 'self'" in response.headers["content-security-policy"]
    start_conversation(page)
    send(page, "Show me some code")
    reply = page.locator(".cs-assistant.cs-completed")
    expect(reply).to_be_visible(timeout=15_000)
    return reply


def _clipboard(page: Any) -> str:
    return str(page.evaluate("navigator.clipboard.readText()"))


def test_python_fence_is_highlighted_labelled_and_copied_exactly(new_page, simulator, use_model):
    page = new_page(permissions=CLIPBOARD)
    reply = _reply(page, simulator, use_model)

    keyword = reply.locator(".cs-code .k").first
    expect(keyword).to_have_text("def")
    expect(reply.locator(".cs-code .nf")).to_have_text("greet")
    expect(keyword).to_have_css("color", KEYWORD_LIGHT)
    expect(reply.locator(".cs-code-lang")).to_have_text(["python"])  # the unnamed one has none

    buttons = reply.get_by_role("button", name="Copy code")
    expect(buttons).to_have_count(2)
    buttons.first.click()
    assert _clipboard(page) == CODE.removesuffix("\n")
    expect(buttons.first).to_have_text("Copied")
    expect(buttons.first).to_have_accessible_name("Copy code")  # "Copied" is said once, here:
    expect(page.locator("p[role=status].cs-visually-hidden")).to_have_text("Copied")
    expect(buttons.first).to_have_text("Copy code", timeout=5_000)

    buttons.nth(1).focus()
    page.keyboard.press("Enter")
    expect(buttons.nth(1)).to_have_text("Copied")
    assert _clipboard(page) == "echo <b>hi</b>"
    screenshot(page, "code-blocks")


def test_copy_reply_copies_the_text_as_shown(new_page, simulator, use_model):
    page = new_page(permissions=CLIPBOARD)
    reply = _reply(page, simulator, use_model)
    button = reply.get_by_role("button", name="Copy reply")
    button.focus()
    expect(button).to_be_focused()
    page.keyboard.press("Enter")
    expect(button).to_have_text("Copied")
    copied = _clipboard(page)
    assert copied.startswith("Two blocks.\n\ndef greet(name):\n")
    assert CODE in copied and "echo <b>hi</b>" in copied and copied.endswith("The end.")
    assert "python" not in copied and "Copy" not in copied  # no label, no button
    # The labels and buttons left out while copying are back.
    expect(reply.locator(".cs-code-lang")).to_be_visible()
    expect(reply.get_by_role("button", name="Copy code")).to_have_count(2)


def test_dark_scheme_uses_the_dark_token_colours(new_page, simulator, use_model):
    page = new_page(color_scheme="dark")
    reply = _reply(page, simulator, use_model)
    expect(reply.locator(".cs-code .k").first).to_have_css("color", KEYWORD_DARK)
    screenshot(page, "code-blocks-dark")


def test_copy_works_without_the_clipboard_api(new_page, simulator, use_model):
    """As on a page served over plain HTTP, where navigator.clipboard does not exist."""
    page = new_page(permissions=CLIPBOARD)
    page.add_init_script("""
        const clipboard = navigator.clipboard;
        window.__readClipboard = () => clipboard.readText();
        Object.defineProperty(navigator, "clipboard", {value: undefined});
    """)
    reply = _reply(page, simulator, use_model)
    button = reply.get_by_role("button", name="Copy code").first
    button.click()
    expect(button).to_have_text("Copied")
    expect(button).to_be_focused()
    assert page.evaluate("window.__readClipboard()") == CODE.removesuffix("\n")


def test_code_blocks_rendered_while_a_reply_streams_get_copy_buttons(
    new_page, simulator, use_model
):
    page = new_page(permissions=CLIPBOARD)
    _reply(page, simulator, use_model)
    slow = f"Here:\n\n```python\n{CODE}```\n\n" + "More words follow the code. " * 40
    simulator.register("slow", Script(text=slow, tokens_per_second=40, first_token_delay=0))
    use_model("slow")
    send(page, "And again, slowly")
    live = page.locator(".cs-assistant.cs-live")
    button = live.get_by_role("button", name="Copy code")
    expect(button).to_be_visible(timeout=15_000)
    expect(live).to_be_visible()  # still streaming
    button.click()
    assert _clipboard(page) == CODE.removesuffix("\n")
    final = page.locator(".cs-assistant.cs-completed").nth(1)
    expect(final).to_be_visible(timeout=30_000)
    expect(final.get_by_role("button", name="Copy code")).to_have_count(1)

"""The chat page in the visitor's language: a browser asking for German (its locale, hence its
Accept-Language) gets the page, the streamed reply's words, the quota sentence's numbers and the
JavaScript's words in German (docs/languages.md)."""

from __future__ import annotations

import re

import pytest

from chatstream.testing import Script

from .conftest import expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CLIPBOARD = ["clipboard-read", "clipboard-write"]


def test_the_chat_page_in_german(new_page, simulator, use_model, settings):
    settings.CHATSTREAM_DEFAULT_QUOTA = {"TOKENS_PER_DAY": 1_500_000}
    use_model("stall")
    page = new_page(locale="de-DE", permissions=CLIPBOARD)
    page.goto("/chat/")
    expect(page.locator("html")).to_have_attribute("lang", "de")
    page.get_by_role("button", name="Neue Unterhaltung").click()
    page.wait_for_url(re.compile(r"/chat/c/[0-9a-f-]+/$"))

    # The composer, and the quota sentence with the number as German writes it.
    box = page.get_by_role("textbox", name="Nachricht")
    expect(box).to_have_attribute("placeholder", "Fragen Sie, was Sie möchten…")
    expect(page.locator("#cs-composer-hint")).to_have_text(
        "Eingabe sendet; Umschalt+Eingabe beginnt eine neue Zeile.")
    expect(page.locator(".cs-quota")).to_have_text(
        "1.500.000 von 1.500.000 Tokens übrig (gleitende 24 Stunden)")

    # A reply as it streams: its Stop, then the sentence of how it ended, and Retry.
    box.fill("Erzähl mir alles")
    page.get_by_role("button", name="Senden").click()
    live = page.locator(".cs-live")
    expect(live.locator('[aria-live="polite"]')).to_have_text(re.compile(r"\S"))
    expect(live.get_by_role("heading", name="Assistent")).to_be_attached()
    expect(live.locator(".cs-stop-hint")).to_have_text("oder Esc drücken")
    live.get_by_role("button", name="Stopp").click()
    stopped = page.locator(".cs-assistant.cs-cancelled")
    expect(stopped.get_by_role("status")).to_have_text("Von Ihnen angehalten.")
    expect(stopped.get_by_role("button", name="Erneut versuchen")).to_be_enabled()
    expect(stopped.get_by_role("button", name="Antwort kopieren")).to_be_visible()

    # A finished reply with code: the JavaScript's Copy button and what it says once used.
    simulator.register("code", Script(text="Code:\n\n```python\nprint(1)\n```\n",
                                      tokens_per_second=0, first_token_delay=0))
    use_model("code")
    box.fill("Zeig mir Code")
    page.get_by_role("button", name="Senden").click()
    done = page.locator(".cs-assistant.cs-completed")
    expect(done).to_be_visible(timeout=15_000)
    copy = done.get_by_role("button", name="Code kopieren")
    copy.click()
    expect(copy).to_have_text("Kopiert")
    expect(page.locator("p[role=status].cs-visually-hidden")).to_have_text("Kopiert")
    # The quota sentence, after two replies, still in German figures.
    page.reload()
    expect(page.locator(".cs-quota")).to_have_text(
        re.compile(r"^\d{1,3}(\.\d{3})* von 1\.500\.000 Tokens übrig \(gleitende 24 Stunden\)$"))
    expect(page.locator(".cs-assistant.cs-completed").get_by_role(
        "button", name="Gute Antwort")).to_be_visible()

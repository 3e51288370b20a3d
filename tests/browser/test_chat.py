"""The chat page in headless Chromium: streaming, Stop, Retry, reload, keyboard, phone width."""

from __future__ import annotations

import itertools
import re
import time

import pytest

from chatstream.exceptions import QuotaExceeded
from chatstream.models import Generation
from chatstream.testing import DEFAULT_TEXT, Script

from .conftest import (
    PHONE,
    composer_box,
    expect,
    no_horizontal_scroll,
    record_stream,
    screenshot,
    send,
    start_conversation,
    streamed_states,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_reply_grows_token_by_token_then_becomes_rendered_markdown(page, simulator, use_model):
    use_model("default?tps=60&first_token_delay=1")
    streams: list[str] = []
    page.on("request", lambda r: "/stream/" in r.url and streams.append(r.url))
    start_conversation(page)
    record_stream(page)
    send(page, "How does streaming work?")

    live = page.locator(".cs-live")
    region = live.locator('[aria-live="polite"]')
    # Before the first token: a typing indicator, a Stop button, a disabled composer.
    expect(live.locator(".cs-typing")).to_be_visible()
    expect(live.get_by_role("button", name="Stop")).to_be_visible()
    expect(composer_box(page)).to_be_disabled()
    expect(page.get_by_role("button", name="Send")).to_be_disabled()
    expect(region).to_have_text(re.compile(r"\S"))
    expect(live.locator(".cs-typing")).to_be_hidden()
    screenshot(page, "streaming")

    final = page.locator(".cs-assistant.cs-completed")
    expect(final).to_be_visible(timeout=15_000)
    stored = Generation.objects.get().content
    assert stored == DEFAULT_TEXT
    states = streamed_states(page, stored)
    # The text grew through many intermediate states, each extending the one before.
    intermediate = [s for s in states if len(s) < len(stored)]
    assert len(intermediate) >= 3, states
    for before, after in itertools.pairwise(states):
        assert after.startswith(before)
    assert stored.startswith(states[-1])
    # The finished reply is Markdown rendered on the server, and no longer connected.
    expect(final.locator("pre code.language-python")).to_contain_text("client.chat.completions")
    expect(final.locator("ol > li")).to_have_count(4)
    expect(final.locator("code").first).to_be_visible()
    assert final.get_attribute("sse-connect") is None
    expect(page.locator("[sse-connect]")).to_have_count(0)
    expect(composer_box(page)).to_be_enabled()
    expect(composer_box(page)).to_be_focused()
    screenshot(page, "finished-reply", full_page=True)
    page.wait_for_timeout(1_500)  # longer than any EventSource or htmx reconnect delay
    assert len(streams) == 1, streams  # never reconnected after `done`
    assert len(simulator.requests) == 1


def test_stop_keeps_the_partial_reply_with_its_label_and_closes_the_upstream(
    page, simulator, use_model
):
    use_model("stall")
    start_conversation(page)
    send(page, "Tell me everything")
    live = page.locator(".cs-live")
    expect(live.locator('[aria-live="polite"]')).to_have_text(re.compile(r"\S"))
    expect(composer_box(page)).to_be_disabled()

    live.get_by_role("button", name="Stop").click()

    stopped = page.locator(".cs-assistant.cs-cancelled")
    expect(stopped).to_be_visible()
    expect(stopped.get_by_role("status")).to_have_text("Stopped by you.")
    expect(stopped.get_by_role("button", name="Retry")).to_be_enabled()
    partial = Generation.objects.get()
    assert partial.status == Generation.Status.CANCELLED and partial.content
    expect(stopped.locator(".cs-markdown")).to_contain_text(partial.content.strip()[:12])
    expect(composer_box(page)).to_be_enabled()
    expect(page.get_by_role("button", name="Send")).to_be_enabled()
    record = simulator.last_request
    assert record.wait_closed(5)
    assert record.client_closed
    screenshot(page, "stopped-reply")


def test_escape_stops_the_reply_being_written(page, simulator, use_model):
    use_model("stall")
    start_conversation(page)
    send(page, "Go on")
    expect(page.locator('.cs-live [aria-live="polite"]')).to_have_text(re.compile(r"\S"))
    page.keyboard.press("Escape")
    expect(page.locator(".cs-assistant.cs-cancelled")).to_be_visible()
    assert simulator.last_request.wait_closed(5) and simulator.last_request.client_closed


def test_retry_after_a_provider_failure_streams_a_new_generation_shown_as_a_retry(
    page, simulator, use_model
):
    use_model("http-500")
    start_conversation(page)
    send(page, "Hello?")
    failed = page.locator(".cs-assistant.cs-failed")
    expect(failed).to_be_visible()
    expect(failed.get_by_role("status")).to_have_text(
        "The AI provider had a problem answering. Please try again.")
    expect(composer_box(page)).to_be_enabled()

    use_model("fast")  # the same allow-list key now reaches a healthy upstream
    failed.get_by_role("button", name="Retry").click()

    retried = page.locator(".cs-assistant.cs-completed")
    expect(retried).to_be_visible()
    expect(retried.locator(".cs-chip")).to_have_text("Retry")
    expect(retried.locator("pre code")).to_be_visible()
    expect(failed).to_be_visible()  # the failed attempt stays, labelled
    first, second = Generation.objects.order_by("created_at")
    assert first.status == Generation.Status.FAILED and first.http_status == 500
    assert second.retry_of_id == first.pk and second.status == Generation.Status.COMPLETED
    assert second.prompt_message_id == first.prompt_message_id
    # The failed reply called the provider twice (once more after the 500: CHATSTREAM_RETRIES),
    # the user's Retry once.
    assert [r.status for r in simulator.requests] == [500, 500, 200]
    assert first.attempts.count() == 2 and second.attempts.count() == 1
    # The page reloaded shows the same: both attempts, the second marked as a retry.
    page.reload()
    expect(page.locator(".cs-assistant")).to_have_count(2)
    expect(page.locator(".cs-assistant").nth(1).locator(".cs-chip")).to_have_text("Retry")


def test_interrupted_reply_keeps_its_text_a_plain_sentence_and_a_retry_button(
    page, simulator, use_model
):
    use_model("drop?drop_after=8")
    start_conversation(page)
    send(page, "Hi")
    interrupted = page.locator(".cs-assistant.cs-interrupted")
    expect(interrupted).to_be_visible()
    expect(interrupted.get_by_role("status")).to_contain_text("The reply was interrupted.")
    expect(interrupted.locator(".cs-markdown")).to_contain_text("Sure!")
    expect(interrupted.get_by_role("button", name="Retry")).to_be_visible()


def test_quota_refusal_reads_as_a_sentence_and_keeps_the_message(page, simulator, monkeypatch):
    def refuse(generation, **kwargs):
        raise QuotaExceeded("You have used all 20 messages for today. More at 09:00.",
                            limit="requests_per_day", retry_after=60)

    monkeypatch.setattr("chatstream.quota.admit", refuse)
    start_conversation(page)
    send(page, "One more, please")
    expect(page.get_by_role("alert")).to_have_text(
        "You have used all 20 messages for today. More at 09:00.")
    expect(composer_box(page)).to_have_value("One more, please")
    expect(composer_box(page)).to_be_enabled()
    expect(page.locator(".cs-exchange")).to_have_count(0)
    assert simulator.requests == []


def test_stream_that_keeps_failing_gives_up_and_frees_the_composer(page, simulator, use_model):
    use_model("fast")
    page.route(re.compile(r".*/stream/(\?ticket=[^/]*)?$"),
               lambda route: route.fulfill(status=503, body="down"))
    start_conversation(page)
    send(page, "Hi")
    reply = page.locator(".cs-assistant.cs-unreachable")
    expect(reply.get_by_role("status")).to_have_text(
        "This reply could not be loaded. Reload the page to see it.")
    expect(page.locator("[sse-connect]")).to_have_count(0)
    expect(composer_box(page)).to_be_enabled()
    expect(reply.get_by_role("button", name="Stop")).to_have_count(0)
    assert simulator.requests == []


def test_reload_mid_stream_shows_the_partial_text_and_how_the_reply_ended(
    page, simulator, use_model, settings
):
    settings.CHATSTREAM_CHECKPOINT_INTERVAL = 0.2
    use_model("default?tps=20")
    start_conversation(page)
    send(page, "Hi")
    expect(page.locator('.cs-live [aria-live="polite"]')).to_have_text(re.compile(r"\w{4}"))
    time.sleep(0.5)  # past a checkpoint
    page.reload()
    reply = page.locator(".cs-assistant")
    expect(reply).to_have_count(1)
    expect(reply.locator(".cs-markdown")).to_contain_text("Sure!")
    expect(page.locator(".cs-live")).to_have_count(0, timeout=15_000)
    # Whatever the disconnect policy, the reply is never an empty bubble or an endless spinner.
    generation = Generation.objects.get()
    assert generation.content.startswith("Sure!")
    assert len(simulator.requests) == 1


def test_reload_mid_stream_carries_on_with_the_live_reply_without_a_second_upstream_call(
    page, simulator, use_model, settings
):
    settings.CHATSTREAM_CHECKPOINT_INTERVAL = 0.2
    use_model("default?tps=20")
    start_conversation(page)
    send(page, "Hi")
    expect(page.locator('.cs-live [aria-live="polite"]')).to_have_text(re.compile(r"\w{4}"))
    time.sleep(0.5)
    page.reload()
    expect(page.locator(".cs-live .cs-live-text")).to_contain_text("Sure!", timeout=3_000)
    expect(page.locator(".cs-assistant.cs-completed")).to_be_visible(timeout=15_000)
    assert Generation.objects.get().content == DEFAULT_TEXT
    assert len(simulator.requests) == 1


def test_second_tab_follows_a_streaming_reply_without_a_second_upstream_call(
    new_page, simulator, use_model, settings
):
    settings.CHATSTREAM_CHECKPOINT_INTERVAL = 0.2
    # About 7 s of text: still being written when the second tab opens on a busy machine.
    use_model("default?tps=25")
    first = new_page()
    url = start_conversation(first)
    send(first, "Hi")
    expect(first.locator('.cs-live [aria-live="polite"]')).to_have_text(re.compile(r"\w{4}"))
    time.sleep(0.5)  # past a checkpoint

    second = first.context.new_page()
    second.goto(url)
    follower = second.locator(".cs-live .cs-live-text")
    expect(follower).to_contain_text("Sure!")  # the stored text, replayed at once
    expect(second.locator(".cs-assistant.cs-completed")).to_be_visible(timeout=30_000)
    expect(first.locator(".cs-assistant.cs-completed")).to_be_visible()
    expect(second.locator(".cs-completed pre code")).to_be_visible()
    assert len(simulator.requests) == 1


def test_enter_sends_and_shift_enter_starts_a_new_line(page, simulator, use_model):
    use_model("fast")
    start_conversation(page)
    box = composer_box(page)
    expect(box).to_be_focused()
    box.press("Enter")  # empty: nothing is sent
    page.keyboard.type("first line")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("second line")
    expect(box).to_have_value("first line\nsecond line")
    expect(page.locator(".cs-exchange")).to_have_count(0)

    page.keyboard.press("Enter")

    expect(page.locator(".cs-user .cs-text")).to_have_text("first line\nsecond line")
    expect(page.locator(".cs-assistant.cs-completed")).to_be_visible()
    expect(box).to_have_value("")
    expect(box).to_be_focused()
    assert simulator.last_request.body["messages"][-1]["content"] == "first line\nsecond line"


def test_keyboard_only_tab_order_reaches_every_control_with_a_visible_focus(
    page, simulator, use_model
):
    use_model("http-500")
    start_conversation(page)
    send(page, "Hi")
    expect(page.locator(".cs-failed")).to_be_visible()
    page.locator(".skip").focus()  # the first element of the page
    order = [["a", "Skip to content"]]
    while not order or order[-1][1] != "Send":
        assert len(order) < 20, order
        page.keyboard.press("Tab")
        focused = page.evaluate("""() => {
            const el = document.activeElement;
            const style = getComputedStyle(el);
            const ring = el.closest('.cs-composer-box');
            const visible = style.outlineStyle !== 'none' ||
                (ring && getComputedStyle(ring).boxShadow !== 'none');
            return [el.tagName.toLowerCase(), (el.innerText || el.getAttribute('aria-label') ||
                    el.name || '').trim().replace(/\\s+/g, ' '), visible];
        }""")
        order.append(focused[:2])
        assert focused[2], f"no visible focus on {focused}"
    names = [name.strip("←↻ ") for _tag, name in order]
    assert names[0] == "Skip to content"
    expected = ["All conversations", "Rename", "Delete", "Retry", "content", "Send"]
    positions = [names.index(name) for name in expected]
    assert positions == sorted(positions), order


def test_page_has_landmarks_and_labelled_controls(page, simulator, use_model):
    use_model("fast")
    start_conversation(page)
    expect(page.get_by_role("main")).to_have_count(1)
    expect(page.get_by_role("banner")).to_have_count(1)
    expect(page.get_by_role("region", name="Conversation")).to_be_visible()
    expect(page.get_by_role("form", name="Chat input")).to_be_visible()
    expect(page.get_by_role("heading", level=1)).to_have_text("New conversation")
    send(page, "A title from the first message")
    expect(page.locator(".cs-assistant.cs-completed")).to_be_visible()
    # The heading took the title without a reload (an out-of-band swap).
    expect(page.get_by_role("heading", level=1)).to_have_text("A title from the first message")
    expect(page.get_by_role("heading", level=2, name="Assistant")).to_have_count(1)


def test_model_picker_sends_with_the_chosen_model(page, simulator, settings):
    settings.CHATSTREAM_MODELS = {
        "quick": {"PROVIDER": "default", "MODEL": "fast", "LABEL": "Quick"},
        "echo": {"PROVIDER": "default", "MODEL": "echo?tps=0", "LABEL": "Echo"},
    }
    start_conversation(page)
    page.get_by_label("Model").select_option(label="Echo")
    send(page, "repeat after me")
    expect(page.locator(".cs-assistant.cs-completed")).to_contain_text("repeat after me")
    assert Generation.objects.get().model == "echo"
    expect(page.get_by_label("Model")).to_have_value("echo")


def test_phone_width_has_no_horizontal_scroll(new_page, simulator, use_model):
    wide = ("| " + " | ".join(f"column {i}" for i in range(12)) + " |\n|"
            + "---|" * 12 + "\n| " + " | ".join("x" * 12 for _ in range(12)) + " |\n\n"
            + "```\n" + "a_very_long_line_of_code() " * 12 + "\n```\n\n"
            + "https://example.org/" + "averyveryverylongpathsegment" * 5)
    simulator.register("wide", Script(text=wide, tokens_per_second=0, first_token_delay=0))
    use_model("wide")
    page = new_page(viewport=PHONE)
    start_conversation(page)
    send(page, "Show me a wide table " + "and a long question " * 10)
    expect(page.locator(".cs-assistant.cs-completed table")).to_be_visible()
    assert no_horizontal_scroll(page)
    screenshot(page, "phone-conversation", full_page=True)
    page.goto("/chat/")
    assert no_horizontal_scroll(page)
    screenshot(page, "phone-list")


def test_dark_colour_scheme_is_followed(new_page, simulator, use_model):
    use_model("fast")
    page = new_page(color_scheme="dark")
    start_conversation(page)
    send(page, "Hello in the dark")
    expect(page.locator(".cs-assistant.cs-completed")).to_be_visible()
    background = page.evaluate(
        "getComputedStyle(document.querySelector('.cs-assistant')).backgroundColor")
    red, green, blue = (int(v) for v in re.findall(r"\d+", background)[:3])
    assert red + green + blue < 200, background
    screenshot(page, "dark-conversation")

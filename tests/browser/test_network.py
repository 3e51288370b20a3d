"""A reply while the network between the browser and the site drops and comes back.

The browser reaches the site through a proxy whose network can be cut (tests/netcut.py): open
connections reset and new ones refused (``rst``), or the browser's side left open and mute
(``silent``: it is never told, as after a phone changed networks). Each mode of
``CHATSTREAM_ON_DISCONNECT`` is tested as a person meets it, on a server under each event loop
a site runs: asyncio's and uvloop.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chatstream.models import Generation

from ..netcut import CutProxy
from .conftest import (
    StaticASGIServer,
    composer_box,
    expect,
    record_stream,
    send,
    start_conversation,
    streamed_states,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MODEL = "default?tps=15&tokens=90&first_token_delay=0"  # about 6 s of text
CUT_FOR = 3000  # ms the network stays down
RECONNECTING = "The connection to the site was lost. Reconnecting…"


def _loop_factory(name: str) -> Any:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def loop_site(request: Any, django_db_setup: Any, django_db_blocker: Any
              ) -> Iterator[StaticASGIServer]:
    """The site served on the event loop named by the test's id."""
    with StaticASGIServer(loop_factory=_loop_factory(request.param)) as server:
        yield server


@pytest.fixture
def network(loop_site: StaticASGIServer) -> Iterator[CutProxy]:
    with CutProxy(loop_site.port) as proxy:
        yield proxy


@pytest.fixture
def quick_watchdog(settings: Any) -> None:
    # A ping every second: a page that hears nothing for 3.5 s connects again.
    settings.CHATSTREAM_PING_INTERVAL = 1


def open_chat(new_page: Any, network: CutProxy) -> Any:
    page = new_page(base_url=network.url)
    start_conversation(page)
    return page


def reply_started(page: Any) -> None:
    expect(page.locator(".cs-live .cs-live-text")).to_have_text(re.compile(r"[\s\S]{40}"))


def blip(page: Any, network: CutProxy, *, silent: bool) -> None:
    """The network goes down for three seconds, then comes back."""
    network.cut(silent=silent)
    page.wait_for_timeout(CUT_FOR)
    network.restore()


def assert_text_only_grew(page: Any, stored: str) -> None:
    """Every state of the live text extended the one before (no character twice, none lost
    and put back), and the last one is where the stored reply goes on from."""
    states = streamed_states(page, stored)
    assert len(states) >= 3, states
    for before, after in itertools.pairwise(states):
        assert after.startswith(before), (before[-40:], after[-40:])
    assert stored.startswith(states[-1])


@pytest.mark.parametrize("silent", [False, True], ids=["rst", "silent"])
def test_abort_mode_a_cut_mid_reply_settles_on_cancelled_with_the_partial_and_retry(
        new_page, network, simulator, use_model, quick_watchdog, silent):
    use_model(MODEL)
    page = open_chat(new_page, network)
    send(page, "Tell me about streaming")
    reply_started(page)
    network.cut(silent=silent)
    live = page.locator(".cs-live")
    if not silent:  # the browser is told: the page says so at once, and nothing looks alive
        expect(live.get_by_role("status")).to_have_text(RECONNECTING)
        expect(live.locator(".cs-typing")).to_be_hidden()
    page.wait_for_timeout(CUT_FOR)
    network.restore()

    stopped = page.locator(".cs-assistant.cs-cancelled")
    expect(stopped).to_be_visible(timeout=10_000)
    generation = Generation.objects.get()
    assert (generation.status, generation.error_type) == ("cancelled", "client_disconnected")
    assert generation.content
    # Exactly the stored text: the last piece, which the page never got before the cut, too.
    expect(stopped.locator(".cs-markdown")).to_contain_text(generation.content.split()[-1])
    expect(stopped.get_by_role("status")).to_have_text(
        "Stopped: the page was closed before the reply finished.")
    expect(stopped.get_by_role("button", name="Retry")).to_be_enabled()
    expect(composer_box(page)).to_be_enabled()
    assert len(simulator.requests) == 1
    assert simulator.last_request.client_closed


@pytest.mark.parametrize("mode", ["grace", "detach"])
@pytest.mark.parametrize("silent", [False, True], ids=["rst", "silent"])
def test_a_cut_mid_reply_that_keeps_going_shows_continuous_text(
        new_page, network, simulator, use_model, quick_watchdog, settings, mode, silent):
    if mode == "grace":
        settings.CHATSTREAM_RECONNECT_GRACE = 30
    else:
        settings.CHATSTREAM_ON_DISCONNECT = "detach"
    use_model(MODEL)
    page = open_chat(new_page, network)
    record_stream(page)
    send(page, "Tell me about streaming")
    reply_started(page)
    blip(page, network, silent=silent)

    finished = page.locator(".cs-assistant.cs-completed")
    expect(finished).to_be_visible(timeout=30_000)
    generation = Generation.objects.get()
    assert generation.status == "completed"
    assert_text_only_grew(page, generation.content)
    assert len(simulator.requests) == 1  # one upstream call, read to its end
    assert not simulator.last_request.client_closed
    expect(composer_box(page)).to_be_enabled()


def test_detach_mode_a_reply_goes_on_across_a_tab_close_and_shows_on_return(
        new_page, network, simulator, use_model, settings):
    settings.CHATSTREAM_ON_DISCONNECT = "detach"
    # About 12 s of text: still being written when the page is back, however busy the machine.
    use_model("default?tps=15&tokens=180&first_token_delay=0")
    page = open_chat(new_page, network)
    conversation = page.url
    send(page, "Tell me about streaming")
    reply_started(page)
    page.close()  # the tab, and its connection, are gone

    time.sleep(1)
    assert Generation.objects.get().status == "streaming"  # written on, for nobody
    back = new_page(base_url=network.url)
    back.goto(conversation)
    record_stream(back)
    expect(back.locator(".cs-live")).to_be_visible()  # still being written: shown live
    finished = back.locator(".cs-assistant.cs-completed")
    expect(finished).to_be_visible(timeout=30_000)
    generation = Generation.objects.get()
    assert generation.status == "completed"
    assert_text_only_grew(back, generation.content)
    expect(finished.locator(".cs-markdown")).to_contain_text(generation.content.split()[-1])
    assert len(simulator.requests) == 1 and not simulator.last_request.client_closed


def test_detach_mode_stop_still_stops_the_reply_after_a_cut(
        new_page, network, simulator, use_model, quick_watchdog, settings):
    settings.CHATSTREAM_ON_DISCONNECT = "detach"
    use_model("stall")
    page = open_chat(new_page, network)
    send(page, "Go on")
    expect(page.locator('.cs-live [aria-live="polite"]')).to_have_text(re.compile(r"\S"))
    blip(page, network, silent=False)
    live = page.locator(".cs-live:not(.cs-reconnecting)")
    expect(live).to_be_visible(timeout=10_000)
    live.get_by_role("button", name="Stop").click()
    stopped = page.locator(".cs-assistant.cs-cancelled")
    expect(stopped.get_by_role("status")).to_have_text("Stopped by you.")
    assert simulator.last_request.wait_closed(5) and simulator.last_request.client_closed
    assert len(simulator.requests) == 1


def test_a_page_that_claims_more_text_than_the_reply_has_is_given_the_text_whole(
        new_page, network, simulator, use_model):
    use_model("stall")  # three pieces, then silence
    page = open_chat(new_page, network)
    send(page, "Go on")
    region = page.locator('.cs-live [aria-live="polite"]')
    expect(region).to_have_text(re.compile(r"\S"))
    page.wait_for_timeout(500)
    shown = region.text_content()
    # The page's stream connects again claiming far more than was sent (a page that showed
    # text from somewhere else): the server answers with the text so far, which replaces it.
    page.evaluate("""() => {
        const live = document.querySelector(".cs-live");
        const fresh = live.cloneNode(true);
        fresh.querySelector(".cs-stream").textContent = "something else entirely";
        fresh.setAttribute("sse-connect", live.dataset.stream + "?after=100000");
        live.replaceWith(fresh);
        htmx.process(fresh);
    }""")
    expect(region).to_have_text(shown)
    page.locator(".cs-live").get_by_role("button", name="Stop").click()
    expect(page.locator(".cs-assistant.cs-cancelled")).to_be_visible()
    assert len(simulator.requests) == 1

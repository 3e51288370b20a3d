"""Browser fixtures: Debian's headless Chromium driven by Playwright's sync API.

``chromium`` is started once for the browser suite; ``page`` is a fresh context per test,
logged in through a signed-cookie session made by Django's test client, pointed at ``site``
(uvicorn serving the app and its static files). A test fails if the page raised an uncaught
JavaScript error. Screenshots go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..conftest import REQUIRE_SERVICES, ASGIServer

CHROMIUM = os.environ.get("CHATSTREAM_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 375, "height": 740}


def _unavailable() -> str | None:
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"Chromium not found at {CHROMIUM} (run scripts/install-chromium.sh)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install chatstream[test])"
    return None


@pytest.fixture(scope="package")
def chromium() -> Iterator[Any]:
    """One headless Chromium for the whole browser suite.

    Package scope, not session: while Playwright's sync API is open it marks its event loop as
    running in the main thread, which would break every asyncio test run after the browser
    tests. For the same reason Django's async-safety check is off (in this process) while it
    lives: the tests' own ORM calls run in the main thread. The server runs in its own thread.
    """
    reason = _unavailable()
    if reason:
        if REQUIRE_SERVICES:
            pytest.fail(reason + " (CHATSTREAM_REQUIRE_SERVICES=1: CI must run the browser tests)")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if previous is None:
            del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


class StaticASGIServer(ASGIServer):
    """The end-to-end server, also serving static files (with the demo's handler, as the demo
    does when ``DEBUG``) for the browser."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        from project.asgi import StaticFilesHandler

        self.server.config.app = StaticFilesHandler(self.server.config.app)


@pytest.fixture(scope="package")
def site(django_db_setup: Any, django_db_blocker: Any) -> Iterator[ASGIServer]:
    """The app and its static files under uvicorn, for the browser suite."""
    with StaticASGIServer() as server:
        yield server


@pytest.fixture
def user(make_user: Callable[..., Any]) -> Any:
    return make_user("alice")


@pytest.fixture
def new_page(chromium: Any, site: Any, user: Any) -> Iterator[Callable[..., Any]]:
    """Open a page in a new context logged in as ``user``; ``new_page(viewport=PHONE)``."""
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(user)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    contexts: list[Any] = []
    errors: list[str] = []

    def open_page(**options: Any) -> Any:
        options.setdefault("viewport", DESKTOP)
        options.setdefault("base_url", site.url)
        context = chromium.new_context(**options)
        context.set_default_timeout(10_000)
        context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session,
                              "url": site.url}])
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(f"{error}\n{error.stack}"))
        # A Content-Security-Policy violation is an error too (the demo sends a strict CSP).
        page.on("console", lambda message: errors.append(message.text)
                if "Content Security Policy" in message.text else None)
        return page

    yield open_page
    for context in contexts:
        context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture
def page(new_page: Callable[..., Any]) -> Any:
    """A desktop-sized page, logged in."""
    return new_page()


def screenshot(page: Any, name: str, *, full_page: bool = False) -> Path:
    """Save ``page`` as test-artifacts/screenshots/<name>.png (and return the path)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{re.sub(r'[^a-z0-9-]+', '-', name.lower())}.png"
    page.screenshot(path=str(path), full_page=full_page, animations="disabled", caret="hide")
    return path


# --- helpers for the tests ------------------------------------------------------------------------


def start_conversation(page: Any) -> str:
    """From the list page, start a conversation; return its URL path."""
    page.goto("/chat/")
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/chat/c/[0-9a-f-]+/$"))
    return str(page.url)


def composer_box(page: Any) -> Any:
    return page.get_by_role("textbox", name="Message")


def open_edit(exchange: Any) -> Any:
    """Open ``exchange``'s Edit and return its box, once the page's own handler of the opening
    has run: it puts the caret at the end of the text, in a ``toggle`` event the browser fires
    a moment after the click (text filled in before it would be typed where the caret lands)."""
    details = exchange.locator(".cs-edit")
    details.evaluate("""(details) => { details.opened = new Promise((done) => {
        const heard = () => { details.removeEventListener("toggle", heard); setTimeout(done); };
        details.addEventListener("toggle", heard);  // after the page's (captured on document)
    }); }""")
    exchange.locator(".cs-edit > summary").click()
    details.evaluate("(details) => details.opened")
    return exchange.get_by_role("textbox", name="Edit your message")


def send(page: Any, text: str) -> None:
    """Type ``text`` in the composer and press Send."""
    composer_box(page).fill(text)
    page.get_by_role("button", name="Send").click()


def record_stream(page: Any) -> None:
    """Record every state of the live reply's text (window.__states) as it changes: how many of
    its characters are rendered Markdown, and the text after them (the live region's)."""
    page.evaluate("""() => {
        window.__states = [];
        new MutationObserver(() => {
            const shown = document.querySelector(".cs-live .cs-live-text");
            if (!shown) return;
            const state = [Number(shown.dataset.rendered || 0),
                           shown.querySelector(".cs-stream").textContent];
            const states = window.__states, last = states[states.length - 1];
            if ((state[0] || state[1]) && !(last && last[0] === state[0] && last[1] === state[1])) {
                states.push(state);
            }
        }).observe(document.body, {subtree: true, childList: true, characterData: true});
    }""")


def streamed_states(page: Any, stored: str) -> list[str]:
    """The states recorded by :func:`record_stream`, each as the text it stands for: the part
    rendered (the first characters of ``stored``, as sent), then the text after it."""
    sent = stored.replace("\r\n", "\n").replace("\r", "\n")
    return [sent[:rendered] + text for rendered, text in page.evaluate("window.__states")]


def no_horizontal_scroll(page: Any) -> bool:
    return bool(page.evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth"))


def expect(target: Any) -> Any:
    """Playwright's ``expect``, imported late so a missing playwright is a skip, not an error."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(target)

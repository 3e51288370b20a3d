"""What the provider sends stays in the reply: no payload text in stored fields other than
``content`` / ``tool_calls``, nor in any log line at INFO or above; and no configured
credential (the API key, any ``HEADERS`` value) in clear anywhere chatstream logs provider text.

DEBUG lines may hold the provider's own error message, with credentials redacted.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

import pytest

from chatstream import provider
from chatstream.completions import ChatCompletionAccumulator
from chatstream.conf import conf
from chatstream.models import Generation
from chatstream.testing import DEFAULT_TEXT

from .conftest import API_KEY, Browser, generation_id, read_events

pytestmark = pytest.mark.django_db(transaction=True)

Status = Generation.Status
PROMPT = "my passphrase is violet-harbour-7731"
HEADER_SECRET = "az-7f3e9c2b1a6d4e8f0b5c"


def logged(caplog: Any, *, at_least: int = logging.INFO) -> str:
    """Every captured line at ``at_least`` or above, as a handler would write it (tracebacks
    included)."""
    formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
    return "\n".join(formatter.format(r) for r in caplog.records if r.levelno >= at_least)


def run(browser: Browser, model: str, prompt: str = "Hi") -> tuple[Generation, str]:
    url = browser.send(browser.new_conversation(), prompt, model)
    with browser.client.stream("GET", url) as response:
        events = [(name, data) for _at, name, data in read_events(response)]
    assert events[-1][0] == "done"
    return Generation.objects.get(pk=generation_id(url)), repr(events)


def stored_beside_the_reply(generation: Generation) -> str:
    """Every stored field but the reply itself (``content``, rendered as ``content_html``,
    ``tool_calls``) and the prompt."""
    return repr({name: value for name, value in generation.__dict__.items()
                 if name not in ("content", "content_html", "tool_calls", "upstream_messages",
                                 "_state")})


def use(settings: Any, spec: str, **headers: str) -> str:
    """A model whose scenario is chosen by header: its name, stored, must not hold the test's
    words."""
    settings.CHATSTREAM_PROVIDERS = {"default": {
        **settings.CHATSTREAM_PROVIDERS["default"],
        "HEADERS": {"X-Simulator-Scenario": spec, **headers}}}
    settings.CHATSTREAM_MODELS = {"test": {"PROVIDER": "default", "MODEL": "gpt-test"}}
    return "test"


# --- payload text out of reason and logs --------------------------------------------------------


def test_a_malformed_chunk_keeps_its_payload_out_of_reason_and_logs(
        make_user, browser_for, simulator, settings, caplog):
    caplog.set_level(logging.DEBUG)
    model = use(settings, "malformed?malformed_after=4&tps=0")
    generation, _ = run(browser_for(make_user()), model)
    assert (generation.status, generation.error_type) == (Status.INTERRUPTED, "malformed_chunk")
    assert generation.content  # the text before the bad chunk is kept
    for text in ("not json", generation.content, DEFAULT_TEXT[:12]):
        assert text not in stored_beside_the_reply(generation)
        assert text not in logged(caplog)
    assert "not valid JSON (9 characters)" in generation.reason  # "{not json": its size only


def test_a_stream_error_message_echoing_the_prompt_stays_out_of_reason_and_logs(
        make_user, browser_for, simulator, settings, caplog):
    caplog.set_level(logging.DEBUG)
    message = quote(f"Your request ({PROMPT}) was refused")
    generation, _ = run(browser_for(make_user()),
                        use(settings, f"error-mid?error_after=3&tps=0&error_message={message}"),
                        prompt=PROMPT)
    assert (generation.status, generation.error_type) == (Status.INTERRUPTED, "stream_error")
    assert "server_error" in generation.reason  # the provider's error type, an identifier
    assert "violet-harbour" not in stored_beside_the_reply(generation)
    assert "violet-harbour" not in logged(caplog)
    assert "violet-harbour" in logged(caplog, at_least=logging.DEBUG)  # documented: DEBUG only


def test_an_http_error_body_echoing_the_prompt_is_logged_at_debug_only(
        make_user, browser_for, simulator, settings, caplog):
    caplog.set_level(logging.DEBUG)
    message = quote(f"Invalid content: {PROMPT}")
    generation, _ = run(browser_for(make_user()),
                        use(settings, f"http-400?error_message={message}"), prompt=PROMPT)
    assert (generation.status, generation.error_type) == (Status.FAILED, "http_400")
    assert "violet-harbour" not in stored_beside_the_reply(generation)
    assert "violet-harbour" not in logged(caplog)
    warning = logged(caplog, at_least=logging.WARNING)
    assert "HTTP 400" in warning and "invalid_request_error" in warning
    assert generation.request_id in warning


def test_an_unexpected_error_is_logged_with_its_traceback_but_not_its_message(
        make_user, browser_for, simulator, settings, caplog, monkeypatch):
    def broken(self: Any, data: str, *, event: str = "message") -> str:
        raise ValueError(f"could not use {data!r}")

    monkeypatch.setattr(ChatCompletionAccumulator, "feed", broken)
    caplog.set_level(logging.DEBUG)
    generation, _ = run(browser_for(make_user()), use(settings, "fast"))
    assert (generation.status, generation.error_type) == (Status.INTERRUPTED, "internal")
    loud = logged(caplog, at_least=logging.ERROR)
    assert "ValueError" in loud and "Traceback" in loud and "broken" in loud
    assert "chat.completion.chunk" not in logged(caplog)


# --- credentials, wherever provider text is logged ----------------------------------------------


def test_a_header_secret_echoed_in_an_error_body_is_redacted_in_every_log_line(
        make_user, browser_for, simulator, settings, caplog):
    caplog.set_level(logging.DEBUG)
    message = quote(f"Incorrect api-key {HEADER_SECRET}; Authorization: Bearer {API_KEY}")
    model = use(settings, f"http-401?error_message={message}",
                **{"api-key": HEADER_SECRET, "X-Title": "Site"})
    generation, events = run(browser_for(make_user()), model)
    assert generation.error_type == "http_401"
    everything = logged(caplog, at_least=logging.DEBUG)
    assert "Incorrect api-key ***" in everything  # the body is logged (DEBUG), redacted
    for secret in (HEADER_SECRET, API_KEY, API_KEY[-12:]):
        assert secret not in everything
        assert secret not in stored_beside_the_reply(generation) and secret not in events


def test_redact_replaces_every_configured_credential_even_inside_longer_text(settings):
    settings.CHATSTREAM_PROVIDERS = {
        "openai": {"BASE_URL": "https://api.example/v1", "API_KEY": "sk-live-abcdef123456"},
        "azure": {"BASE_URL": "https://az.example/openai", "API_KEY": "k-azure-998877",
                  "AUTH_HEADER": "api-key",
                  "HEADERS": {"Ocp-Apim-Subscription-Key": "0123456789abcdef",
                              "X-Region": "eu-west", "api-version": "2024-10-21"}},
    }
    text = ("key=sk-live-abcdef123456, token:k-azure-998877; sub=0123456789abcdefXYZ "
            "region eu-west, https://x.example/?api_key=zzz&v=1")
    assert provider.redact(text) == (
        "key=***, token:***; sub=***XYZ region eu-west, https://x.example/?api_key=***&v=1")
    # A configured value shorter than 8 characters ("eu-west") is left as is: short values
    # are rarely secret and too common to take out of every log line.


def test_a_short_api_key_is_still_redacted_but_short_header_values_are_not(settings):
    settings.CHATSTREAM_PROVIDERS = {"p": {"BASE_URL": "http://x", "API_KEY": "abcd",
                                           "HEADERS": {"X-Flag": "xyzwvut"}}}
    assert provider.redact("abcd xyzwvut") == "*** xyzwvut"


def test_a_request_repr_shows_no_header_and_no_key_in_its_url(settings):
    settings.CHATSTREAM_PROVIDERS = {"p": {"BASE_URL": "https://gen.example/v1?key=AIza-secret",
                                           "HEADERS": {"x-goog-api-key": "AIza-secret"}}}
    settings.CHATSTREAM_MODELS = {"m": {"PROVIDER": "p", "MODEL": "g"}}
    model = conf.get_model("m")
    assert model is not None
    request = provider.build_request(model, [{"role": "user", "content": PROMPT}])
    assert "AIza" not in repr(request) and "violet" not in repr(request)

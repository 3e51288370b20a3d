"""Request hooks (``CHATSTREAM_REQUEST_HOOKS``) through the real path: messages posted to the
live server, the simulated upstream recording what it was sent."""

from __future__ import annotations

import html
import logging
import re
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.urls import reverse

from chatstream import api, quota
from chatstream.conf import conf
from chatstream.domain.history import MESSAGE_OVERHEAD, build_history
from chatstream.domain.usage import estimate_tokens
from chatstream.exceptions import QuotaExceeded, RequestRefused
from chatstream.models import Conversation, Generation, Message, QuotaCharge

from . import hooks_for_tests as hooks
from .conftest import generation_id, read_events

pytestmark = pytest.mark.django_db(transaction=True)

Status = Generation.Status
SYSTEM = "Be brief."
GENERIC = "This request could not be sent. Please try again later."
REFUSAL = "Questions about billing go to the billing desk, not to the assistant."
MODEL_MAX_TOKENS = 1024  # CHATSTREAM_MAX_TOKENS' default


@pytest.fixture(autouse=True)
def hook_state(settings: Any) -> Any:
    hooks.reset()
    settings.CHATSTREAM_SYSTEM_PROMPT = SYSTEM
    yield hooks
    hooks.reset()


def use_hooks(settings: Any, *paths: str) -> None:
    settings.CHATSTREAM_REQUEST_HOOKS = list(paths)


def post(browser: Any, conversation_url: str, content: str, *, htmx: bool = True
         ) -> httpx.Response:
    return browser.post(conversation_url + "messages/", {"content": content, "model": ""},
                        htmx=htmx)


def stream_url_in(response: httpx.Response) -> str:
    match = re.search(r'sse-connect="([^"]+)"', response.text)
    assert match, response.text
    return html.unescape(match.group(1))


def stream_to_end(browser: Any, url: str) -> list[tuple[str, str]]:
    with browser.client.stream("GET", url, timeout=10) as response:
        assert response.status_code == 200
        return [(name, data) for _at, name, data in read_events(response)]


def send_and_finish(browser: Any, conversation_url: str, content: str) -> Generation:
    url = stream_url_in(post(browser, conversation_url, content))
    assert stream_to_end(browser, url)[-1][0] == "done"
    return Generation.objects.get(pk=generation_id(url))


def latest() -> Generation:
    return Generation.objects.select_related("prompt_message").latest("created_at")


# --- what hooks see, and in which order -----------------------------------------------------------


def test_sync_and_async_hooks_run_in_order_and_see_the_generation_user_request_and_messages(
    settings, make_user, browser_for, simulator
):
    use_hooks(settings, hooks.SYNC_HOOK, hooks.ASYNC_HOOK)
    hooks.state.sync_action = hooks.add_system_text("Added by the sync hook.")
    user = make_user()
    browser = browser_for(user)
    conversation = browser.new_conversation()
    first = send_and_finish(browser, conversation, "First question")
    hooks.state.calls.clear()

    generation = send_and_finish(browser, conversation, "Second question")

    sync, async_ = hooks.state.calls
    assert (sync.hook, async_.hook) == ("sync", "async")
    for seen in (sync, async_):
        assert seen.generation_pk == generation.pk  # set before the hooks, kept on save
        assert seen.generation_model == "fast"
        assert seen.prompt == "Second question"
        assert seen.user_pk == user.pk
        assert isinstance(seen.request, HttpRequest)
        assert seen.request.path == conversation + "messages/"
        assert seen.params == {}
    history = [
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": "Second question"},
    ]
    assert sync.messages == [{"role": "system", "content": SYSTEM}, *history]
    # The second hook is given what the first one left.
    assert async_.messages == [{"role": "system", "content": SYSTEM},
                               {"role": "system", "content": "Added by the sync hook."},
                               *history]
    assert simulator.last_request.body["messages"] == async_.messages


def test_hooks_get_no_request_from_the_python_api(settings, make_user, simulator):
    use_hooks(settings, hooks.SYNC_HOOK, hooks.ASYNC_HOOK)
    user = make_user()
    generation = api.send(user, "From a task queue")
    assert [(c.hook, c.request, c.user_pk, c.generation_pk) for c in hooks.state.calls] == [
        ("sync", None, user.pk, generation.pk), ("async", None, user.pk, generation.pk)]
    assert generation.status == Status.PENDING
    assert api.run(generation).status == Status.COMPLETED
    assert simulator.last_request.body["messages"] == [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "From a task queue"}]


def test_an_async_hook_runs_for_a_message_sent_from_async_code(settings, make_user, simulator):
    use_hooks(settings, hooks.SYNC_HOOK, hooks.ASYNC_HOOK)
    hooks.state.async_action = hooks.set_params(temperature=0.3)
    user = make_user()

    async def from_a_view() -> Generation:
        generation = await api.asend(user, "From async code")
        return await api.arun(generation)

    generation = async_to_sync(from_a_view)()
    assert [c.hook for c in hooks.state.calls] == ["sync", "async"]
    assert generation.status == Status.COMPLETED
    assert simulator.last_request.body["temperature"] == 0.3


def test_retry_runs_the_hooks_again_with_the_retried_question(
    settings, make_user, browser_for, simulator
):
    use_hooks(settings, hooks.SYNC_HOOK)
    browser = browser_for(make_user())
    original = send_and_finish(browser, browser.new_conversation(), "Say it again")
    hooks.state.calls.clear()
    hooks.state.sync_action = hooks.set_params(temperature=0.1)

    response = browser.post(reverse("chatstream:generation-retry", kwargs={"pk": original.pk}))
    assert response.status_code == 200, response.text
    retried = Generation.objects.get(pk=generation_id(stream_url_in(response)))
    assert retried.retry_of_id == original.pk
    [seen] = hooks.state.calls
    assert seen.generation_pk == retried.pk and seen.prompt == "Say it again"
    assert seen.messages[-1] == {"role": "user", "content": "Say it again"}
    assert retried.upstream_params == {"temperature": 0.1}


# --- what a hook adds is what is sent, and what is counted ----------------------------------------


def test_what_a_hook_adds_is_exactly_what_the_upstream_receives_and_what_is_stored(
    settings, make_user, browser_for, simulator
):
    use_hooks(settings, hooks.SYNC_HOOK)
    faq = "FAQ: opening hours are 9 to 5."
    hooks.state.sync_action = hooks.add_system_text(faq)
    browser = browser_for(make_user())
    generation = send_and_finish(browser, browser.new_conversation(), "When are you open?")
    sent = [{"role": "system", "content": SYSTEM}, {"role": "system", "content": faq},
            {"role": "user", "content": "When are you open?"}]
    assert simulator.last_request.body["messages"] == sent
    assert generation.upstream_messages == sent
    # The reservation was made for what was sent, the hook's text included.
    assert QuotaCharge.objects.get(generation_id=generation.pk).prompt_estimate == (
        quota.estimate_prompt(sent))


TOOL_EXCHANGE = [
    {"role": "user", "content": "Where is order 7?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function",
         "function": {"name": "order_status", "arguments": '{"order_id": 7}'}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": '{"status": "shipped"}'},
    {"role": "assistant", "content": "It has shipped."},
]


def _insert_before_last(messages: list[dict[str, Any]]) -> hooks.Action:
    def act(call: Any) -> None:
        call.messages[-1:-1] = messages

    return act


def test_a_hook_may_send_an_earlier_tool_exchange_and_it_is_counted_as_sent(
    settings, make_user, browser_for, simulator
):
    use_hooks(settings, hooks.SYNC_HOOK)
    hooks.state.sync_action = _insert_before_last(TOOL_EXCHANGE)
    browser = browser_for(make_user())
    generation = send_and_finish(browser, browser.new_conversation(), "And order 8?")
    sent = [{"role": "system", "content": SYSTEM}, *TOOL_EXCHANGE,
            {"role": "user", "content": "And order 8?"}]
    assert simulator.last_request.body["messages"] == sent  # the simulator checks the pairing
    assert generation.upstream_messages == sent and generation.status == Status.COMPLETED
    estimate = QuotaCharge.objects.get(generation_id=generation.pk).prompt_estimate
    assert estimate == quota.estimate_prompt(sent)
    assert estimate > quota.estimate_prompt([m for m in sent if "tool_calls" not in m])


def test_an_object_whose_call_is_async_is_awaited_as_a_hook(
    settings, make_user, browser_for, simulator
):
    use_hooks(settings, hooks.ASYNC_OBJECT_HOOK)
    hooks.state.async_action = hooks.add_system_text("From an object.")
    browser = browser_for(make_user())
    generation = send_and_finish(browser, browser.new_conversation(), "Hi")
    assert [seen.hook for seen in hooks.state.calls] == ["async object"]
    assert simulator.last_request.body["messages"][1] == {"role": "system",
                                                          "content": "From an object."}
    assert generation.status == Generation.Status.COMPLETED


def test_a_quota_that_admits_the_message_refuses_it_once_a_hook_adds_a_big_faq(
    settings, make_user, browser_for, simulator
):
    plain = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello"}]
    settings.CHATSTREAM_DEFAULT_QUOTA = {
        "TOKENS_PER_DAY": quota.estimate_prompt(plain) + MODEL_MAX_TOKENS + 10}
    use_hooks(settings, hooks.SYNC_HOOK)
    hooks.state.sync_action = hooks.add_system_text("FAQ " * 200)  # ~200 tokens more
    browser = browser_for(make_user())
    conversation = browser.new_conversation()

    response = post(browser, conversation, "Hello")
    assert response.status_code == 429, response.text
    assert "tokens" in response.text
    assert not Message.objects.exists() and not Generation.objects.exists()
    assert not QuotaCharge.objects.exists()
    assert simulator.requests == []

    hooks.state.sync_action = None  # the same message, nothing added: it fits
    generation = send_and_finish(browser, conversation, "Hello")
    assert generation.upstream_messages == plain
    assert len(simulator.requests) == 1


def test_a_quota_refusal_rolls_back_what_the_hook_wrote(settings, make_user, simulator):
    from django.contrib.auth.models import Group

    settings.CHATSTREAM_DEFAULT_QUOTA = {"TOKENS_PER_DAY": 10}  # nothing fits
    use_hooks(settings, hooks.SYNC_HOOK)

    def audit(call: Any) -> None:
        Group.objects.create(name=f"audit-{call.generation.pk}")

    hooks.state.sync_action = audit
    with pytest.raises(QuotaExceeded):
        api.send(make_user(), "Hello")
    assert len(hooks.state.calls) == 1
    assert not Group.objects.exists()
    assert not Message.objects.exists()


def test_the_python_api_counts_what_hooks_add_too(settings, make_user, simulator):
    plain = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello"}]
    settings.CHATSTREAM_DEFAULT_QUOTA = {
        "TOKENS_PER_DAY": quota.estimate_prompt(plain) + MODEL_MAX_TOKENS + 10}
    use_hooks(settings, hooks.SYNC_HOOK)
    hooks.state.sync_action = hooks.add_system_text("FAQ " * 200)
    with pytest.raises(QuotaExceeded):
        api.send(make_user(), "Hello")
    assert not Generation.objects.exists()


def test_the_context_budget_applies_after_the_hooks_dropping_the_oldest_turns(
    settings, make_user, browser_for, simulator
):
    settings.CHATSTREAM_MODELS = {"fast": {"PROVIDER": "default", "MODEL": "fast?text=Fine."}}
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    questions = ["First question, padded out a bit.", "Second question, padded out a bit.",
                 "Third question, padded out a bit."]
    for question in questions:
        send_and_finish(browser, conversation, question)
    turns = [[{"role": "user", "content": q}, {"role": "assistant", "content": "Fine."}]
             for q in questions]
    new = {"role": "user", "content": "Fourth question"}
    everything = [{"role": "system", "content": SYSTEM}, *turns[0], *turns[1], *turns[2], new]
    # A budget that holds the whole conversation exactly...
    settings.CHATSTREAM_MODELS["fast"]["CONTEXT_TOKENS"] = quota.estimate_prompt(everything)
    # ...and a hook's text that takes the room of the two oldest turns.
    turn_tokens = sum(estimate_tokens(m["content"]) + MESSAGE_OVERHEAD for m in turns[0])
    assert turn_tokens == sum(estimate_tokens(m["content"]) + MESSAGE_OVERHEAD
                              for m in turns[1])
    faq = "F" * 4 * (2 * turn_tokens - MESSAGE_OVERHEAD)
    use_hooks(settings, hooks.SYNC_HOOK)
    hooks.state.sync_action = hooks.add_system_text(faq)

    generation = send_and_finish(browser, conversation, "Fourth question")

    assert hooks.state.calls[-1].messages == everything  # the hook saw the whole history
    sent = [{"role": "system", "content": SYSTEM}, {"role": "system", "content": faq},
            *turns[2], new]
    assert simulator.last_request.body["messages"] == sent
    assert generation.upstream_messages == sent


def test_a_hook_text_larger_than_the_budget_keeps_the_system_text_and_the_new_message(
    settings, make_user, browser_for, simulator
):
    settings.CHATSTREAM_MODELS = {"fast": {"PROVIDER": "default", "MODEL": "fast?text=Fine.",
                                           "CONTEXT_TOKENS": 200}}
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    send_and_finish(browser, conversation, "An earlier question")
    use_hooks(settings, hooks.SYNC_HOOK)
    faq = "A big FAQ. " * 100
    hooks.state.sync_action = hooks.add_system_text(faq)
    send_and_finish(browser, conversation, "The new question")
    assert simulator.last_request.body["messages"] == [
        {"role": "system", "content": SYSTEM}, {"role": "system", "content": faq},
        {"role": "user", "content": "The new question"}]


# --- params ---------------------------------------------------------------------------------------


def test_a_temperature_and_a_lower_max_tokens_set_by_a_hook_reach_the_upstream(
    settings, make_user, browser_for, simulator
):
    use_hooks(settings, hooks.SYNC_HOOK)
    hooks.state.sync_action = hooks.set_params(temperature=0.2, max_tokens=50)
    browser = browser_for(make_user())
    generation = send_and_finish(browser, browser.new_conversation(), "Hi")
    body = simulator.last_request.body
    assert body["temperature"] == 0.2
    assert body["max_tokens"] == 50
    assert body["stream"] is True and body["model"] == "fast"
    assert generation.upstream_params == {"temperature": 0.2, "max_tokens": 50}


def test_a_hooks_params_go_on_top_of_the_models_params(
    settings, make_user, browser_for, simulator
):
    settings.CHATSTREAM_MODELS["fast"]["PARAMS"] = {"temperature": 1.0, "top_p": 0.5}
    use_hooks(settings, hooks.SYNC_HOOK)
    hooks.state.sync_action = hooks.set_params(temperature=0.0)
    browser = browser_for(make_user())
    send_and_finish(browser, browser.new_conversation(), "Hi")
    body = simulator.last_request.body
    assert (body["temperature"], body["top_p"]) == (0.0, 0.5)


def _replace_messages(value: Any) -> hooks.Action:
    def act(call: Any) -> None:
        call.messages = value

    return act


def _append_message(message: Any) -> hooks.Action:
    def act(call: Any) -> None:
        call.messages.append(message)

    return act


def _replace_params(value: Any) -> hooks.Action:
    def act(call: Any) -> None:
        call.params = value

    return act


INVALID = [
    pytest.param(hooks.set_params(model="gpt-expensive"), id="param-model"),
    pytest.param(hooks.set_params(stream=False), id="param-stream"),
    pytest.param(hooks.set_params(n=3), id="param-n"),
    pytest.param(hooks.set_params(stream_options={"include_usage": False}),
                 id="param-stream_options"),
    pytest.param(hooks.set_params(messages=[]), id="param-messages"),
    pytest.param(hooks.set_params(tools=[]), id="param-tools"),
    pytest.param(hooks.set_params(tool_choice="auto"), id="param-tool_choice"),
    pytest.param(hooks.set_params(max_tokens=MODEL_MAX_TOKENS + 1), id="max_tokens-above-model"),
    pytest.param(hooks.set_params(max_completion_tokens=10**6),
                 id="max_completion_tokens-above-model"),
    pytest.param(hooks.set_params(max_tokens=0), id="max_tokens-zero"),
    pytest.param(hooks.set_params(max_tokens="50"), id="max_tokens-not-a-number"),
    pytest.param(hooks.set_params(temperature={0.5}), id="param-not-json"),
    pytest.param(_replace_messages("Hello"), id="messages-not-a-list"),
    pytest.param(_replace_messages([]), id="messages-empty"),
    pytest.param(_append_message({"role": "wizard", "content": "Obey."}), id="messages-bad-role"),
    pytest.param(_append_message({"role": "user", "content": 42}), id="messages-content-not-str"),
    pytest.param(_append_message({"role": "user", "content": [{"type": "text", "text": "x"}]}),
                 id="messages-content-parts"),
    pytest.param(_append_message("user: hello"), id="messages-item-not-a-dict"),
    pytest.param(_append_message({"role": "tool", "content": "42"}), id="tool-without-its-call-id"),
    pytest.param(_append_message({"role": "assistant", "content": None}),
                 id="assistant-without-text-or-calls"),
    pytest.param(_append_message({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": {"a": 1}}}]}),
                 id="tool-call-arguments-not-text"),
    pytest.param(_append_message({"role": "user", "content": None, "tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": "{}"}}]}),
                 id="user-with-tool-calls-and-no-text"),
    pytest.param(_replace_params(None), id="params-not-a-dict"),
    pytest.param(hooks.explode, id="hook-raises"),
]


@pytest.mark.parametrize("action", INVALID)
def test_a_hook_that_fails_or_leaves_an_invalid_request_refuses_with_a_generic_sentence(
    settings, make_user, browser_for, simulator, caplog, action
):
    use_hooks(settings, hooks.SYNC_HOOK)
    hooks.state.sync_action = action
    browser = browser_for(make_user())
    conversation = browser.new_conversation()

    response = post(browser, conversation, "Hello there")

    assert response.status_code == 200, response.text
    generation = latest()
    assert generation.status == Status.FAILED
    assert generation.error_type == "hook_failed"
    assert generation.reason == "a request hook failed"
    assert generation.prompt_message.content == "Hello there"  # the message is kept
    # The page is given the failed reply, saying so where the reply would be; no stream.
    article = _article(response.text, generation)
    assert GENERIC in html.unescape(article)
    assert "sse-connect" not in response.text
    # Where it failed is logged for the site's developers (its words at DEBUG only).
    [record] = [r for r in caplog.records
                if r.name == "chatstream.hooks" and r.levelno >= logging.INFO]
    assert record.levelno == logging.ERROR and "Traceback" in record.getMessage()
    assert hooks.SYNC_HOOK in record.getMessage()
    # A stream asked for anyway ends at once.
    events = stream_to_end(browser, reverse("chatstream:generation-stream",
                                            kwargs={"pk": generation.pk}))
    assert events[-1][0] == "done"
    assert "delta" not in [name for name, _data in events]
    assert simulator.requests == []
    assert not QuotaCharge.objects.exists()


def test_a_failed_hook_on_a_plain_post_redirects_to_the_page_that_says_so(
    settings, make_user, browser_for, simulator, caplog
):
    use_hooks(settings, hooks.SYNC_HOOK)
    hooks.state.sync_action = hooks.explode
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    response = post(browser, conversation, "Hello there", htmx=False)
    assert response.status_code == 302
    page = browser.client.get(response.headers["location"]).text
    assert GENERIC in html.unescape(_article(page, latest()))
    assert simulator.requests == []


def test_a_failed_hook_is_a_refused_generation_from_the_python_api_too(
    settings, make_user, simulator, caplog
):
    use_hooks(settings, hooks.SYNC_HOOK)
    hooks.state.sync_action = hooks.explode
    with pytest.raises(RequestRefused) as refused:
        api.send(make_user(), "Hello")
    assert refused.value.message == GENERIC
    assert refused.value.generation is not None
    assert refused.value.generation.error_type == "hook_failed"
    assert [r.name for r in caplog.records if r.levelno >= logging.INFO] == ["chatstream.hooks"]
    assert simulator.requests == []


SECRET = "my passphrase is violet-harbour-7731"


def _quoting_the_message(call: Any) -> None:
    raise ValueError(f"cannot handle {call.messages[-1]['content']!r}")


@pytest.mark.parametrize("action", [
    pytest.param(_replace_messages(SECRET), id="messages-the-text"),
    pytest.param(_replace_messages([SECRET]), id="message-the-text"),
    pytest.param(_append_message({"role": SECRET, "content": "x"}), id="role-the-text"),
    pytest.param(_append_message({"role": "user", "content": [SECRET]}),
                 id="content-holding-the-text"),
    pytest.param(lambda call: call.messages.append(call.messages[-1]["content"]),
                 id="message-the-users-text"),
    pytest.param(hooks.set_params(user=SECRET, max_tokens=SECRET), id="param-the-text"),
    pytest.param(hooks.set_params(user={SECRET}), id="param-not-json"),
    pytest.param(_replace_params(SECRET), id="params-the-text"),
    pytest.param(_quoting_the_message, id="hook-raises-quoting-it"),
])
def test_a_failed_hook_logs_no_word_of_the_users_text_above_debug(
    settings, make_user, simulator, caplog, action
):
    caplog.set_level(logging.DEBUG, logger="chatstream")
    use_hooks(settings, hooks.SYNC_HOOK)
    hooks.state.sync_action = action
    with pytest.raises(RequestRefused):
        api.send(make_user(), SECRET)
    formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
    above_debug = "\n".join(formatter.format(r) for r in caplog.records
                            if r.levelno > logging.DEBUG)  # tracebacks included
    [failed] = [r for r in caplog.records
                if r.name == "chatstream.hooks" and r.levelno > logging.DEBUG]
    assert hooks.SYNC_HOOK in failed.getMessage() and "Traceback" in failed.getMessage()
    # Not a word of it: no piece of 6 characters or more.
    assert not [piece for piece in SECRET.split() if len(piece) >= 6 and piece in above_debug]
    # The exception's own words are there for a developer who turns DEBUG on.
    assert any(r.exc_info for r in caplog.records if r.levelno == logging.DEBUG)


def test_a_hook_that_changes_nothing_after_an_earlier_one_failed_is_never_called(
    settings, make_user, browser_for, simulator, caplog
):
    use_hooks(settings, hooks.SYNC_HOOK, hooks.ASYNC_HOOK)
    hooks.state.sync_action = hooks.explode
    browser = browser_for(make_user())
    post(browser, browser.new_conversation(), "Hello")
    assert [c.hook for c in hooks.state.calls] == ["sync"]
    assert latest().error_type == "hook_failed"


# --- RequestRefused -------------------------------------------------------------------------------


def _article(page: str, generation: Generation) -> str:
    match = re.search(rf'<article[^>]*id="generation-{generation.pk}".*?</article>', page,
                      re.DOTALL)
    assert match, page
    return match.group(0)


@pytest.mark.parametrize("htmx", [True, False], ids=["htmx-post", "plain-post"])
def test_a_refusal_keeps_the_message_and_shows_the_sentence_where_the_reply_would_be(
    settings, make_user, browser_for, simulator, htmx
):
    settings.CHATSTREAM_DEFAULT_QUOTA = {"TOKENS_PER_DAY": 50_000}
    use_hooks(settings, hooks.ASYNC_HOOK)
    hooks.state.async_action = hooks.refuse(REFUSAL)
    user = make_user()
    browser = browser_for(user)
    conversation = browser.new_conversation()

    response = post(browser, conversation, "How much do I owe?", htmx=htmx)

    generation = latest()
    if htmx:
        assert response.status_code == 200, response.text
        page = response.text
        assert "How much do I owe?" in page  # the new exchange, the user's message included
    else:
        assert response.status_code == 302
        page = browser.client.get(response.headers["location"]).text
    assert REFUSAL in html.unescape(_article(page, generation))
    assert "sse-connect" not in _article(page, generation)
    assert generation.status == Status.FAILED
    assert generation.error_type == "refused"
    assert generation.reason == REFUSAL
    assert generation.prompt_message.content == "How much do I owe?"
    assert Conversation.objects.get().title == "How much do I owe?"
    assert simulator.requests == []
    assert not QuotaCharge.objects.exists()
    assert quota.remaining(user).tokens_day == 50_000  # type: ignore[union-attr]
    # The page shows it again on reload.
    assert REFUSAL in html.unescape(_article(browser.client.get(conversation).text, generation))
    # A stream asked for anyway ends at once, with no upstream call.
    events = stream_to_end(browser, reverse("chatstream:generation-stream",
                                            kwargs={"pk": generation.pk}))
    assert events[-1][0] == "done" and "delta" not in [name for name, _data in events]
    assert simulator.requests == []


def test_a_refusal_sentence_is_shown_as_text_never_as_markup(
    settings, make_user, browser_for, simulator
):
    use_hooks(settings, hooks.SYNC_HOOK)
    sentence = 'You asked about <script>alert("x")</script>: not here.'
    hooks.state.sync_action = hooks.refuse(sentence)
    browser = browser_for(make_user())
    response = post(browser, browser.new_conversation(), "Hello")
    article = _article(response.text, latest())
    assert "<script>" not in article
    assert sentence in html.unescape(article)


def test_a_long_refusal_keeps_and_shows_its_first_200_characters(
    settings, make_user, browser_for, simulator
):
    use_hooks(settings, hooks.SYNC_HOOK)
    sentence = "This assistant only answers questions about your own orders. " * 5
    hooks.state.sync_action = hooks.refuse(sentence)
    browser = browser_for(make_user())
    response = post(browser, browser.new_conversation(), "Hello")
    generation = latest()
    assert generation.reason == sentence[:200]
    assert sentence[:200].strip() in html.unescape(_article(response.text, generation))


def test_retrying_a_refused_generation_runs_the_hooks_again(
    settings, make_user, browser_for, simulator
):
    use_hooks(settings, hooks.SYNC_HOOK)
    hooks.state.sync_action = hooks.refuse(REFUSAL)
    browser = browser_for(make_user())
    post(browser, browser.new_conversation(), "How much do I owe?")
    refused = latest()
    assert refused.error_type == "refused"
    retry_url = reverse("chatstream:generation-retry", kwargs={"pk": refused.pk})

    again = browser.post(retry_url)  # still refused: a second refused generation
    assert again.status_code == 200, again.text
    second = latest()
    assert second.pk != refused.pk and second.retry_of_id == refused.pk
    assert second.error_type == "refused"
    assert REFUSAL in html.unescape(_article(again.text, second))
    assert len(hooks.state.calls) == 2

    hooks.state.sync_action = None  # the site changed its mind
    response = browser.post(retry_url)
    assert response.status_code == 200, response.text
    url = stream_url_in(response)
    assert stream_to_end(browser, url)[-1][0] == "done"
    third = Generation.objects.get(pk=generation_id(url))
    assert third.status == Status.COMPLETED and third.retry_of_id == refused.pk
    assert len(hooks.state.calls) == 3
    assert simulator.last_request.body["messages"][-1] == {
        "role": "user", "content": "How much do I owe?"}


def test_the_hooks_after_a_refusing_one_do_not_run(settings, make_user, browser_for,
                                                   simulator):
    use_hooks(settings, hooks.SYNC_HOOK, hooks.ASYNC_HOOK)
    hooks.state.sync_action = hooks.refuse(REFUSAL)
    browser = browser_for(make_user())
    post(browser, browser.new_conversation(), "Hello")
    assert [c.hook for c in hooks.state.calls] == ["sync"]
    assert latest().error_type == "refused"


def test_a_refusal_from_the_python_api_raises_with_the_kept_generation(
    settings, make_user, simulator
):
    use_hooks(settings, hooks.SYNC_HOOK)
    hooks.state.sync_action = hooks.refuse(REFUSAL)
    with pytest.raises(RequestRefused) as refused:
        api.send(make_user(), "How much do I owe?")
    generation = refused.value.generation
    assert refused.value.message == REFUSAL
    assert generation is not None
    stored = Generation.objects.get(pk=generation.pk)
    assert (stored.status, stored.error_type, stored.reason) == (Status.FAILED, "refused",
                                                                 REFUSAL)
    assert simulator.requests == []


def test_hooks_do_not_run_for_a_user_the_access_setting_denies(
    settings, make_user, simulator
):
    settings.CHATSTREAM_ACCESS = hooks.ACCESS
    hooks.state.access = {"alice": False}
    use_hooks(settings, hooks.SYNC_HOOK)
    with pytest.raises(PermissionDenied):
        api.send(make_user("alice"), "Hello")
    assert hooks.state.calls == []


# --- no hooks -------------------------------------------------------------------------------------


def test_with_no_hooks_the_request_is_the_stored_conversation_and_the_models_fields_only(
    settings, make_user, browser_for, simulator
):
    assert conf.REQUEST_HOOKS == []
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    first = send_and_finish(browser, conversation, "First")
    generation = send_and_finish(browser, conversation, "Second")
    assert generation.upstream_params == {}
    assert generation.upstream_messages == build_history(generation) == [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "First"},
        {"role": "assistant", "content": first.content}, {"role": "user", "content": "Second"}]
    body = simulator.last_request.body
    assert body["messages"] == generation.upstream_messages
    assert set(body) == {"model", "messages", "stream", "stream_options", "max_tokens"}
    assert body["max_tokens"] == MODEL_MAX_TOKENS


def test_importable_sync_and_async_hooks_and_access_pass_the_system_checks(settings):
    from django.core.checks import run_checks

    settings.CHATSTREAM_REQUEST_HOOKS = [hooks.SYNC_HOOK, hooks.ASYNC_HOOK]
    settings.CHATSTREAM_ACCESS = hooks.ACCESS
    assert [m.id for m in run_checks() if m.id and m.id.startswith("chatstream.")] == []

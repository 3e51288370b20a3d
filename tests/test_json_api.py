"""The JSON API, end to end: the app under uvicorn (``asgi_server``), the simulated upstream on
loopback, httpx as the client (a session with its CSRF token, or a bearer token)."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from chatstream.exceptions import RequestRefused
from chatstream.models import Conversation, Generation, Message, ToolCall
from chatstream.sse import ServerSentEvent, SSEDecoder
from chatstream.testing import DEFAULT_TEXT

from .conftest import Browser

API = "/chat/api"
TEXT = "Line one\r\nline two\rthree <b>&amp;</b> <script>x</script>\r\n\r\nend \U0001f389"
PAUSED_TEXT = "One two three four five six seven eight nine ten eleven twelve."


def as_sent(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


# --- what the tests' settings point at ------------------------------------------------------------

def bearer(request: Any) -> Any:
    """A token authenticator: ``Authorization: Bearer token-<username>``."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme != "Bearer" or not token.startswith("token-"):
        return None
    return get_user_model().objects.filter(username=token.removeprefix("token-")).first()


async def abearer(request: Any) -> Any:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme != "Bearer" or not token.startswith("token-"):
        return None
    return await get_user_model().objects.filter(username=token.removeprefix("token-")).afirst()


def reads_the_body_badly(request: Any) -> Any:
    """An authenticator with a bug whose words quote the request's body."""
    raise ValueError(f"cannot read {request.body[:80]!r}")


def nobody(user: Any) -> bool:
    return False


def refuse(call: Any) -> None:
    raise RequestRefused("Not on a Sunday.")


# --- clients --------------------------------------------------------------------------------------

class Api:
    """A JSON API client: ``session`` (a signed-in browser's cookies, its CSRF token sent) or
    ``headers`` (a token, no cookies)."""

    def __init__(self, base_url: str, *, session: Browser | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.client = session.client if session else httpx.Client(base_url=base_url, timeout=30)
        self.headers = dict(headers or {})
        if session is not None:
            self.headers["X-CSRFToken"] = session.csrf

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.client.get(url, headers={**self.headers, **kwargs.pop("headers", {})},
                               **kwargs)

    def post(self, url: str, body: Any = None, **kwargs: Any) -> httpx.Response:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        if body is not None:
            kwargs["json"] = body
        return self.client.post(url, headers=headers, **kwargs)

    def conversation(self, **body: Any) -> dict[str, Any]:
        response = self.post(f"{API}/conversations/", body)
        assert response.status_code == 201, response.text
        return response.json()  # type: ignore[no-any-return]

    def send(self, content: str = "Hi", model: str | None = None,
             conversation: dict[str, Any] | None = None) -> dict[str, Any]:
        conversation = conversation or self.conversation()
        response = self.post(conversation["messages_url"], {"content": content, "model": model})
        assert response.status_code == 201, response.text
        return response.json()  # type: ignore[no-any-return]

    def events(self, url: str, **headers: str) -> tuple[int, list[ServerSentEvent]]:
        response = self.get(url, headers=headers)
        decoder = SSEDecoder()
        return response.status_code, decoder.feed(response.content) + decoder.close()

    def finished(self, model: str) -> dict[str, Any]:
        """A reply streamed to its end: the generation JSON of its ``done`` event."""
        sent = self.send(model=model)
        status, events = self.events(sent["stream_url"])
        assert status == 200 and events[-1].event == "done"
        return json.loads(events[-1].data)  # type: ignore[no-any-return]


@pytest.fixture
def api_for(asgi_server: Any, browser_for: Any) -> Any:
    def open_for(user: Any) -> Api:
        return Api(asgi_server.url, session=browser_for(user))

    return open_for


@pytest.fixture
def anonymous(asgi_server: Any) -> Any:
    with httpx.Client(base_url=asgi_server.url, timeout=30) as client:
        yield client


def texts(events: list[ServerSentEvent]) -> str:
    return "".join(json.loads(e.data)["text"] for e in events if e.event in ("delta", "reset"))


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    return error  # type: ignore[no-any-return]


pytestmark = pytest.mark.django_db(transaction=True)


# --- conversations --------------------------------------------------------------------------------

def test_conversations_are_listed_newest_first_a_page_at_a_time(make_user, api_for):
    from datetime import timedelta

    from django.utils import timezone

    alice = make_user()
    now = timezone.now()
    made = [Conversation.objects.create(user=alice, title=f"c{i}", model="fast",
                                        updated_at=now - timedelta(minutes=i))
            for i in range(23)]
    Conversation.objects.create(user=make_user("bob"), title="bob's")
    api = api_for(alice)
    first = api.get(f"{API}/conversations/").json()
    assert [c["id"] for c in first["results"]] == [str(c.pk) for c in made[:20]]
    second = api.get(first["next"]).json()
    assert [c["id"] for c in second["results"]] == [str(c.pk) for c in made[20:]]
    assert second["next"] is None
    assert_error(api.get(f"{API}/conversations/?page=3"), 404, "not_found")
    assert_error(api.get(f"{API}/conversations/?page=x"), 400, "invalid")


def test_a_conversation_is_created_with_its_model_and_title(make_user, api_for):
    api = api_for(make_user())
    response = api.post(f"{API}/conversations/", {"model": "fast", "title": "  Plans  "})
    assert response.status_code == 201
    created = response.json()
    assert response.headers["location"] == created["url"]
    assert (created["title"], created["model"]) == ("Plans", "fast")
    conversation = Conversation.objects.get()
    assert str(conversation.pk) == created["id"] and conversation.title == "Plans"
    # An empty body is a conversation with the default model.
    assert api.post(f"{API}/conversations/").status_code == 201
    assert_error(api.post(f"{API}/conversations/", {"model": "gpt-9"}), 400, "invalid")
    assert_error(api.post(f"{API}/conversations/", {"title": "x" * 201}), 400, "invalid")
    assert Conversation.objects.count() == 2


def test_a_conversation_reads_as_its_messages_and_generations_never_what_went_upstream(
        make_user, api_for, use_model, settings):
    api = api_for(make_user())
    model = use_model("fast")
    conversation = api.conversation()
    for content in ("one", "two", "three"):
        sent = api.send(content, model, conversation)
        api.events(sent["stream_url"])
    settings.CHATSTREAM_CONVERSATION_PAGE_SIZE = 2
    latest = api.get(conversation["url"]).json()
    assert [m["content"] for m in latest["messages"]] == ["two", "three"]
    assert latest["newer"] is None and latest["older"]
    generation = latest["messages"][-1]["generations"][0]
    assert generation["status"] == "completed" and generation["content"] == DEFAULT_TEXT
    assert generation["stream_url"] is None
    older = api.get(latest["older"]).json()
    assert [m["content"] for m in older["messages"]] == ["one"]
    assert older["older"] is None and older["newer"] == conversation["url"]
    assert "upstream" not in json.dumps([latest, older])
    assert_error(api.get(conversation["url"] + "?before=oops"), 400, "invalid")
    assert_error(api.get(conversation["url"] + "?before=999999"), 404, "not_found")


# --- a message and its stream ---------------------------------------------------------------------

class Reader(threading.Thread):
    """One connection to a stream, read to its end in the background (leaving it early would
    be a client gone, which ends the reply)."""

    def __init__(self, api: Api, url: str) -> None:
        super().__init__(daemon=True)
        self.api, self.url = api, url
        self.events: list[ServerSentEvent] = []

    def run(self) -> None:
        decoder = SSEDecoder()
        with self.api.client.stream("GET", self.url) as response:
            for chunk in response.iter_raw():
                self.events += decoder.feed(chunk)

    def deltas(self) -> int:
        return sum(e.event == "delta" for e in list(self.events))


def wait_for(condition: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_reply_streams_as_raw_text_whose_ids_count_it_and_done_is_the_generation(
        make_user, api_for, use_model, simulator):
    api = api_for(make_user())
    model = use_model(f"default?tps=200&first_token_delay=0&text={quote(TEXT)}")
    conversation = api.conversation()
    sent = api.send("Hi <i>there</i>", model, conversation)
    assert sent["message"]["content"] == "Hi <i>there</i>"
    assert sent["generation"]["status"] == "pending"
    assert sent["stream_url"] == sent["generation"]["stream_url"]
    status, events = api.events(sent["stream_url"])
    assert status == 200
    deltas = [e for e in events if e.event == "delta"]
    assert len(deltas) >= 2
    seen = ""
    for event in deltas:
        seen += json.loads(event.data)["text"]
        assert event.id == str(len(seen))  # characters: the emoji counts one
    assert seen == as_sent(TEXT)  # raw text: the markup is text, not escaped, not rendered
    stored = Generation.objects.get()
    assert stored.content == TEXT
    done = json.loads(events[-1].data)
    assert events[-1].event == "done"
    # The same form as the generation's own address, its attempts as the stream made them
    # (read from no query), but for the times, which the database rounds.
    fetched = api.get(done["url"]).json()
    [attempt] = done["attempts"]
    assert (attempt["number"], attempt["model"], attempt["status"]) == (1, done["model"],
                                                                        "succeeded")
    times = ("started_at", "first_token_at", "finished_at")
    assert [{k: v for k, v in a.items() if k not in times} for a in fetched.pop("attempts")] == [
        {k: v for k, v in attempt.items() if k not in times}]
    assert {**done, "attempts": None} == {**fetched, "attempts": None}
    assert (done["status"], done["content"], done["finish_reason"]) == ("completed", TEXT, "stop")
    assert done["conversation"] == conversation["id"] and done["notice"] == ""
    assert done["usage"]["source"] in ("provider", "estimated")
    assert done["usage"]["completion_tokens"] == stored.completion_tokens
    assert done["created_at"] and done["completed_at"] and done["stream_url"] is None
    assert (done["cost"], done["currency"]) == (None, None)  # the model has no price
    assert len(simulator.requests) == 1


def test_a_generation_carries_its_cost_as_an_exact_decimal_string(
        settings, make_user, api_for, use_model, simulator):
    api = api_for(make_user())
    model = use_model("default?tps=200&first_token_delay=0")
    settings.CHATSTREAM_MODELS[model]["PRICE"] = {"INPUT": "0.10", "OUTPUT": "0.40"}
    sent = api.send("Hi", model, api.conversation())
    _status, events = api.events(sent["stream_url"])
    done = json.loads(events[-1].data)
    stored = Generation.objects.get()
    assert stored.cost is not None and stored.cost > 0
    assert done["cost"] == format(stored.cost, "f") and done["currency"] == "USD"
    assert api.get(done["url"]).json()["cost"] == done["cost"]
    assert Decimal(done["cost"]) == stored.cost


@pytest.mark.parametrize("how", ["Last-Event-ID", "after"])
def test_a_stream_resumes_after_the_characters_the_client_has(make_user, api_for, use_model,
                                                              simulator, how):
    api = api_for(make_user())
    done = api.finished(use_model(f"fast?text={quote(TEXT)}"))
    url = f"{API}/generations/{done['id']}/stream/"
    whole = as_sent(TEXT)
    for have in (0, 1, 12, len(whole) - 1, len(whole)):
        if how == "after":
            status, events = api.events(f"{url}?after={have}")
        else:
            status, events = api.events(url, **{"Last-Event-ID": str(have)})
        assert status == 200 and events[-1].event == "done"
        assert texts(events) == whole[have:]
        assert all(int(e.id) > have for e in events if e.event == "delta")
    assert len(simulator.requests) == 1


def test_a_client_claiming_text_of_a_reply_not_started_is_reset_to_nothing(
        make_user, api_for, use_model):
    api = api_for(make_user())
    sent = api.send(model=use_model("fast"))
    status, events = api.events(sent["stream_url"] + "?after=5")
    assert status == 200
    assert (events[0].event, json.loads(events[0].data), events[0].id) == (
        "reset", {"text": ""}, "0")
    assert texts(events) == DEFAULT_TEXT and events[-1].event == "done"


def test_a_client_claiming_more_than_a_live_reply_has_is_reset_to_its_whole_text(
        make_user, api_for, use_model):
    api = api_for(make_user())
    sent = api.send(model=use_model("stall"))  # three pieces, then silence
    starter = Reader(api, sent["stream_url"])
    starter.start()
    wait_for(lambda: starter.deltas() == 3)
    have = texts(starter.events)
    with api.client.stream("GET", sent["stream_url"],
                           headers={"Last-Event-ID": "100000"}) as resumed:
        decoder, events, chunks = SSEDecoder(), [], resumed.iter_raw()
        for chunk in chunks:
            events += decoder.feed(chunk)
            if any(e.event == "reset" for e in events):
                break
        assert api.post(sent["generation"]["url"] + "stop/").status_code == 202
        for chunk in chunks:
            events += decoder.feed(chunk)
    starter.join(15)
    events = [e for e in events if e.event != "ping"]
    assert (events[0].event, json.loads(events[0].data), events[0].id) == (
        "reset", {"text": have}, str(len(have)))
    assert [e.event for e in events[1:]] == ["done"]
    done = json.loads(events[-1].data)
    assert (done["status"], done["content"]) == ("cancelled", have)
    assert starter.events[-1].data == events[-1].data


@pytest.mark.parametrize("value", ["-1", "x", "1.5", "9" * 19])
def test_a_resume_point_that_is_not_a_whole_number_is_refused(make_user, api_for, use_model,
                                                              value):
    api = api_for(make_user())
    sent = api.send(model=use_model("fast"))
    assert_error(api.get(sent["stream_url"], headers={"Last-Event-ID": value}), 400, "invalid")
    assert Generation.objects.get().status == "pending"  # nothing started


def test_stop_ends_a_live_reply_keeping_what_it_wrote(make_user, api_for, use_model):
    api = api_for(make_user())
    sent = api.send(model=use_model("default?tps=20&first_token_delay=0"))
    reader = Reader(api, sent["stream_url"])
    reader.start()
    wait_for(lambda: reader.deltas() >= 1)
    response = api.post(f"{API}/generations/{sent['generation']['id']}/stop/")
    assert response.status_code == 202 and response.json()["id"] == sent["generation"]["id"]
    reader.join(15)
    events = reader.events
    assert not reader.is_alive() and events[-1].event == "done"
    done = json.loads(events[-1].data)
    assert done["status"] == "cancelled" and done["notice"] == "Stopped by you."
    assert done["content"] and DEFAULT_TEXT.startswith(done["content"])
    assert done["content"] != DEFAULT_TEXT and texts(events) == done["content"]
    assert Generation.objects.get().content == done["content"]
    # A finished reply: nothing to stop.
    again = api.post(f"{API}/generations/{done['id']}/stop/")
    assert again.status_code == 202 and again.json()["status"] == "cancelled"


def test_retry_answers_the_same_message_again(make_user, api_for, use_model, simulator):
    api = api_for(make_user())
    model = use_model("fast")
    first = api.finished(model)
    response = api.post(f"{API}/generations/{first['id']}/retry/")
    assert response.status_code == 201
    retried = response.json()
    assert response.headers["location"] == retried["url"]
    assert retried["retry_of"] == first["id"] and retried["message"] == first["message"]
    assert retried["status"] == "pending" and retried["stream_url"]
    status, events = api.events(retried["stream_url"])
    assert status == 200 and json.loads(events[-1].data)["status"] == "completed"
    assert len(simulator.requests) == 2
    assert Message.objects.filter(role="user").count() == 1


def test_retry_of_a_live_reply_is_a_conflict(make_user, api_for, use_model):
    api = api_for(make_user())
    sent = api.send(model=use_model("fast"))
    assert_error(api.post(f"{API}/generations/{sent['generation']['id']}/retry/"), 409,
                 "still_live")
    assert Generation.objects.count() == 1


def test_under_wsgi_a_pending_reply_fails_at_once_and_then_the_stream_is_a_501(
        make_user, simulator, use_model):
    from django.test import Client

    client = Client()
    client.force_login(make_user())
    conversation = client.post(f"{API}/conversations/", {}, content_type="application/json").json()
    sent = client.post(conversation["messages_url"], {"content": "Hi", "model": use_model("fast")},
                       content_type="application/json").json()
    response = client.get(sent["stream_url"])  # the test client speaks WSGI
    assert response.status_code == 200
    events = SSEDecoder().feed(response.content)
    assert [e.event for e in events] == ["error", "done"]
    assert "cannot stream" in json.loads(events[0].data)["message"]
    done = json.loads(events[1].data)
    assert (done["status"], done["error_type"]) == ("failed", "unsupported_server")
    assert done["notice"] == json.loads(events[0].data)["message"]
    assert_wsgi_error(client.get(sent["stream_url"]), 501, "streaming_unavailable")
    assert_wsgi_error(client.get(f"{API}/generations/{uuid.uuid4()}/stream/"), 404, "not_found")
    assert simulator.requests == []


def assert_wsgi_error(response: Any, status: int, code: str) -> None:
    assert response.status_code == status and response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == code


# --- refusals -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "content_type", "code"), [
    (b"{", "application/json", "invalid_json"),
    (b"[1]", "application/json", "invalid_json"),
    (b"content=Hi", "application/x-www-form-urlencoded", "unsupported_content_type"),
    (b'{"content": "   "}', "application/json", "invalid"),
    (b'{"content": 5}', "application/json", "invalid"),
    (b'{}', "application/json", "invalid"),
    (b'{"content": "Hi", "model": ["fast"]}', "application/json", "invalid"),
], ids=["bad-json", "not-an-object", "form-encoded", "blank", "not-a-string", "missing",
        "model-not-a-string"])
def test_a_message_that_is_not_one_is_a_400(make_user, api_for, body, content_type, code):
    api = api_for(make_user())
    conversation = api.conversation()
    response = api.post(conversation["messages_url"], content=body,
                        headers={"Content-Type": content_type})
    assert_error(response, 400, code)
    assert not Message.objects.exists()


def test_a_body_larger_than_the_site_takes_is_a_413(make_user, api_for, settings):
    api = api_for(make_user())
    conversation = api.conversation()
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000  # Django's bound on a body read in memory
    error = assert_error(api.post(conversation["messages_url"], {"content": "x" * 2000}),
                         413, "too_large")
    assert "too large" in error["message"]
    assert not Message.objects.exists()
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    assert api.post(conversation["messages_url"], {"content": "x" * 2000}).status_code == 201


def test_a_message_too_long_says_the_limit(make_user, api_for, settings):
    settings.CHATSTREAM_MAX_MESSAGE_LENGTH = 10
    api = api_for(make_user())
    error = assert_error(api.post(api.conversation()["messages_url"], {"content": "x" * 11}),
                         400, "invalid")
    assert "10" in error["message"]


def test_a_model_the_user_may_not_use_is_a_403(make_user, api_for):
    api = api_for(make_user())
    response = api.post(api.conversation()["messages_url"], {"content": "Hi", "model": "gpt-9"})
    assert_error(response, 403, "forbidden")


def test_a_full_conversation_is_a_409(make_user, api_for, settings, use_model):
    settings.CHATSTREAM_MAX_CONVERSATION_MESSAGES = 1
    api = api_for(make_user())
    conversation = api.conversation()
    api.send("one", use_model("fast"), conversation)
    assert_error(api.post(conversation["messages_url"], {"content": "two"}), 409,
                 "conversation_full")
    assert api.get(conversation["url"]).json()["full"] is True


def test_a_quota_refusal_is_a_429_with_retry_after_and_keeps_nothing(make_user, api_for,
                                                                     settings, use_model):
    settings.CHATSTREAM_DEFAULT_QUOTA = {"REQUESTS_PER_MINUTE": 1}
    api = api_for(make_user())
    conversation = api.conversation()
    api.send("one", use_model("fast"), conversation)
    response = api.post(conversation["messages_url"], {"content": "two"})
    error = assert_error(response, 429, "quota_exceeded")
    assert 0 < int(response.headers["retry-after"]) <= 60
    assert error["retry_after"] == int(response.headers["retry-after"])
    assert error["limit"] == "requests_per_minute"
    assert Message.objects.count() == 1


def test_a_hook_refusal_is_a_created_failed_generation_that_says_why(make_user, api_for,
                                                                     settings, simulator):
    settings.CHATSTREAM_REQUEST_HOOKS = ["tests.test_json_api.refuse"]
    api = api_for(make_user())
    response = api.post(api.conversation()["messages_url"], {"content": "Hi"})
    assert response.status_code == 201
    created = response.json()
    assert created["stream_url"] is None and created["message"]["content"] == "Hi"
    generation = created["generation"]
    assert (generation["status"], generation["error_type"], generation["notice"]) == (
        "failed", "refused", "Not on a Sunday.")
    assert not simulator.requests


def test_a_retry_a_hook_refuses_is_a_created_failed_generation_that_says_why(
        make_user, api_for, settings, use_model, simulator):
    api = api_for(make_user())
    first = api.finished(use_model("fast"))
    settings.CHATSTREAM_REQUEST_HOOKS = ["tests.test_json_api.refuse"]
    response = api.post(f"{API}/generations/{first['id']}/retry/")
    assert response.status_code == 201
    retried = response.json()
    assert response.headers["location"] == retried["url"]
    assert retried["retry_of"] == first["id"] and retried["stream_url"] is None
    assert (retried["status"], retried["error_type"], retried["notice"]) == (
        "failed", "refused", "Not on a Sunday.")
    assert len(simulator.requests) == 1  # the first reply's only


def test_too_many_followers_is_a_429(make_user, api_for, settings, use_model):
    settings.CHATSTREAM_MAX_FOLLOWERS = 1
    api = api_for(make_user())
    sent = api.send(model=use_model("default?tps=10&first_token_delay=0"))
    url = sent["stream_url"]
    with api.client.stream("GET", url) as starter, api.client.stream(
            "GET", url + "?after=0", headers={"Last-Event-ID": "0"}) as follower:
        assert starter.status_code == 200 and follower.status_code == 200
        response = api.get(url, headers={"Last-Event-ID": "0"})
        assert_error(response, 429, "too_many_streams")
        assert response.headers["retry-after"]
        api.post(f"{API}/generations/{sent['generation']['id']}/stop/")


# Every address of the API, with the method that uses it and what it names.
URLS = [
    ("api-conversations", "GET", None),
    ("api-conversations", "POST", None),
    ("api-conversation", "GET", "conversation"),
    ("api-messages", "POST", "conversation"),
    ("api-message-generations", "GET", "message"),
    ("api-generation", "GET", "generation"),
    ("api-generation-stream", "GET", "generation"),
    ("api-generation-stop", "POST", "generation"),
    ("api-generation-retry", "POST", "generation"),
    ("api-generation-feedback", "GET", "generation"),
    ("api-generation-feedback", "POST", "generation"),
    ("api-generation-tool-calls", "GET", "generation"),
    ("api-toolcall-approve", "POST", "toolcall"),
    ("api-toolcall-deny", "POST", "toolcall"),
]
URL_IDS = [f"{method}-{name}" for name, method, _kind in URLS]
OBJECT_URLS = [url for url in URLS if url[2]]
# The stream and Stop serve a reply already admitted, as on the pages.
CHAT_URLS = [url for url in URLS if url[0] not in ("api-generation-stream",
                                                   "api-generation-stop")]


def url_of(name: str, kind: str | None, generation: dict[str, Any]) -> str:
    if kind == "toolcall":  # a call of the generation's, waiting for its owner's decision
        call = ToolCall.objects.create(generation_id=generation["id"], position=0, name="x",
                                       status=ToolCall.Status.PENDING_APPROVAL)
        return reverse(f"chatstream:{name}", args=[call.pk])
    field = {"generation": "id", "conversation": "conversation", "message": "message"}
    args = [] if kind is None else [generation[field[kind]]]
    return reverse(f"chatstream:{name}", args=args)


def test_every_api_url_is_covered_by_these_tests():
    from chatstream.json_api import urls

    names = {p.name for p in urls.urlpatterns if p.name}
    assert names == {name for name, _method, _kind in URLS}


@pytest.mark.parametrize(("name", "method", "kind"), URLS, ids=URL_IDS)
def test_no_one_signed_in_is_a_401_never_a_redirect(make_user, api_for, anonymous, use_model,
                                                     name, method, kind):
    sent = api_for(make_user()).send(model=use_model("fast"))
    response = anonymous.request(method, url_of(name, kind, sent["generation"]),
                                 json={"content": "Hi"})
    assert_error(response, 401, "not_authenticated")
    assert Generation.objects.get().status == "pending"
    assert Conversation.objects.count() == 1


@pytest.mark.parametrize(("name", "method", "kind"), CHAT_URLS,
                         ids=[f"{m}-{n}" for n, m, _k in CHAT_URLS])
def test_a_user_the_access_setting_denies_is_a_403(make_user, api_for, settings, use_model,
                                                    name, method, kind):
    api = api_for(make_user())
    done = api.finished(use_model("fast"))
    settings.CHATSTREAM_ACCESS = "tests.test_json_api.nobody"
    response = api.client.request(method, url_of(name, kind, done), headers=api.headers,
                                  json={"content": "Hi"})
    assert_error(response, 403, "forbidden")
    assert Generation.objects.count() == 1 and Conversation.objects.count() == 1


@pytest.mark.parametrize(("name", "method", "kind"), OBJECT_URLS,
                         ids=[f"{m}-{n}" for n, m, _k in OBJECT_URLS])
def test_another_users_records_are_not_found(make_user, api_for, use_model, name, method, kind):
    alice = api_for(make_user())
    sent = alice.send("secret", model=use_model("default?tps=10&first_token_delay=0"))
    bob = api_for(make_user("bob"))
    response = bob.client.request(method, url_of(name, kind, sent["generation"]),
                                  headers=bob.headers, json={"content": "Hi"})
    assert_error(response, 404, "not_found")
    assert "secret" not in response.text
    assert bob.get(f"{API}/conversations/").json()["results"] == []
    generation = Generation.objects.get()
    assert (generation.status, generation.cancel_requested) == ("pending", False)
    assert Message.objects.count() == 1


def test_an_unknown_address_or_method_is_answered_in_json(make_user, api_for):
    api = api_for(make_user())
    assert_error(api.get(f"{API}/nothing/here/"), 404, "not_found")
    assert_error(api.get(f"{API}/generations/not-a-uuid/"), 404, "not_found")
    response = api.client.delete(f"{API}/conversations/", headers=api.headers)
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "GET, POST"
    stop = api.get(f"{API}/generations/{uuid.uuid4()}/stop/")
    assert_error(stop, 405, "method_not_allowed")
    assert stop.headers["allow"] == "POST"


def test_answers_are_json_for_this_site_alone_and_never_cached(make_user, api_for, use_model):
    api = api_for(make_user())
    sent = api.send(model=use_model("fast"))
    for response in (api.get(f"{API}/conversations/"),
                     api.get(sent["generation"]["url"]),
                     api.get(f"{API}/conversations/?page=9")):
        assert response.headers["content-type"] == "application/json"
        assert response.headers["cache-control"] == "no-store"
        assert "access-control-allow-origin" not in response.headers
    streamed = api.get(sent["stream_url"], headers={"Origin": "https://elsewhere.example"})
    assert streamed.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert "access-control-allow-origin" not in streamed.headers


# --- authentication -------------------------------------------------------------------------------

def test_a_session_post_without_the_csrf_token_is_refused(make_user, api_for):
    api = api_for(make_user())
    response = api.client.post(f"{API}/conversations/", json={})
    assert_error(response, 403, "csrf_failed")
    wrong = api.client.post(f"{API}/conversations/", json={}, headers={"X-CSRFToken": "x" * 32})
    assert_error(wrong, 403, "csrf_failed")
    assert not Conversation.objects.exists()
    assert api.post(f"{API}/conversations/", {}).status_code == 201


@pytest.mark.parametrize("authenticator", ["bearer", "abearer"], ids=["sync", "async"])
def test_a_token_authenticator_speaks_for_its_user_without_csrf(make_user, asgi_server, settings,
                                                                use_model, authenticator):
    settings.CHATSTREAM_API_AUTHENTICATE = f"tests.test_json_api.{authenticator}"
    make_user()
    make_user("bob")
    model = use_model("fast")
    with httpx.Client(base_url=asgi_server.url, timeout=30,
                      headers={"Authorization": "Bearer token-alice"}) as client:
        created = client.post(f"{API}/conversations/", json={"title": "Mine"})
        assert created.status_code == 201
        assert Conversation.objects.get().user.username == "alice"
        sent = client.post(created.json()["messages_url"], json={"content": "Hi", "model": model})
        assert sent.status_code == 201
        stream = client.get(sent.json()["stream_url"])
        events = SSEDecoder().feed(stream.content)
        assert texts(events) == DEFAULT_TEXT
        assert json.loads(events[-1].data)["status"] == "completed"
        stop = client.post(f"{API}/generations/{sent.json()['generation']['id']}/stop/")
        assert stop.status_code == 202
        listed = client.get(f"{API}/conversations/").json()["results"]
        assert [c["title"] for c in listed] == ["Mine"]
    with httpx.Client(base_url=asgi_server.url, timeout=30,
                      headers={"Authorization": "Bearer token-bob"}) as client:
        assert client.get(f"{API}/conversations/").json()["results"] == []
        assert_error(client.get(sent.json()["generation"]["url"]), 404, "not_found")
    with httpx.Client(base_url=asgi_server.url, timeout=30,
                      headers={"Authorization": "Bearer token-mallory"}) as client:
        assert_error(client.get(f"{API}/conversations/"), 401, "not_authenticated")
        assert_error(client.post(f"{API}/conversations/", json={}), 401, "not_authenticated")


def test_a_500_is_logged_without_the_words_of_its_exception(make_user, asgi_server, settings,
                                                            caplog):
    settings.CHATSTREAM_API_AUTHENTICATE = "tests.test_json_api.reads_the_body_badly"
    caplog.set_level(logging.DEBUG, logger="django.request")
    with httpx.Client(base_url=asgi_server.url, timeout=30) as client:
        response = client.post(f"{API}/conversations/", json={"title": "violet-harbour-7731"})
    assert_error(response, 500, "server_error")
    assert "violet" not in response.text
    formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
    logged = "\n".join(formatter.format(r) for r in caplog.records if r.levelno > logging.DEBUG)
    assert "Internal Server Error: /chat/api/conversations/ (ValueError)" in logged
    assert "Traceback" in logged and "violet" not in logged
    assert any("violet" in str(r.exc_info[1]) for r in caplog.records
               if r.levelno == logging.DEBUG and r.exc_info)


def test_an_inactive_users_token_is_not_enough(make_user, asgi_server, settings):
    settings.CHATSTREAM_API_AUTHENTICATE = "tests.test_json_api.bearer"
    make_user(is_active=False)
    with httpx.Client(base_url=asgi_server.url, timeout=30,
                      headers={"Authorization": "Bearer token-alice"}) as client:
        assert_error(client.get(f"{API}/conversations/"), 401, "not_authenticated")


def test_with_an_authenticator_the_session_still_works_with_its_csrf_check(
        make_user, api_for, settings):
    settings.CHATSTREAM_API_AUTHENTICATE = "tests.test_json_api.bearer"
    api = api_for(make_user())
    assert api.post(f"{API}/conversations/", {}).status_code == 201
    assert_error(api.client.post(f"{API}/conversations/", json={}), 403, "csrf_failed")

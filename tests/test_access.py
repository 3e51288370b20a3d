"""Access control, CSRF, bad input and secrets: what no user may see or do."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, reverse

from chatstream.models import Conversation, Generation, Message, ToolCall
from chatstream.sse import SSEDecoder
from chatstream.stream import _serving
from chatstream.testing import Script

from .conftest import API_KEY, generation_id

pytestmark = pytest.mark.django_db(transaction=True)


def logged_in(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def start_exchange(client: Client, content: str = "Hi", model: str = "fast") -> Generation:
    conversation = client.post(reverse("chatstream:conversation-create"))["Location"]
    response = client.post(conversation + "messages/", {"content": content, "model": model})
    assert response.status_code == 302, response.content
    return Generation.objects.latest("created_at")


def target_of(generation: Generation, kind: str) -> Any:
    if kind == "toolcall":  # a call of the generation's, waiting for its owner's decision
        return ToolCall.objects.create(generation=generation, name="x",
                                       position=ToolCall.objects.count(),
                                       status=ToolCall.Status.PENDING_APPROVAL).pk
    return {"conversation": generation.conversation_id, "generation": generation.pk,
            "message": generation.prompt_message_id}[kind]


OBJECT_URLS = [
    ("chatstream:conversation-detail", "get", "conversation"),
    ("chatstream:conversation-rename", "post", "conversation"),
    ("chatstream:conversation-delete", "get", "conversation"),
    ("chatstream:conversation-delete", "post", "conversation"),
    ("chatstream:conversation-export", "get", "conversation"),
    ("chatstream:message-create", "post", "conversation"),
    ("chatstream:generation-stream", "get", "generation"),
    ("chatstream:generation-cancel", "post", "generation"),
    ("chatstream:generation-retry", "post", "generation"),
    ("chatstream:generation-feedback", "post", "generation"),
    ("chatstream:message-edit", "post", "message"),
    ("chatstream:message-version", "get", "message"),
    ("chatstream:toolcall-approve", "post", "toolcall"),
    ("chatstream:toolcall-deny", "post", "toolcall"),
]


@pytest.mark.parametrize(("name", "method", "kind"), OBJECT_URLS,
                         ids=[f"{m}-{n.split(':')[1]}" for n, m, _k in OBJECT_URLS])
def test_another_users_objects_are_404_and_untouched(make_user, simulator, name, method, kind):
    owner, other = make_user("owner"), make_user("mallory")
    generation = start_exchange(logged_in(owner))
    target = target_of(generation, kind)
    response = getattr(logged_in(other), method)(
        reverse(name, kwargs={"pk": target}), {"content": "injected", "title": "pwned"})
    assert response.status_code == 404
    assert Message.objects.count() == 1
    assert Conversation.objects.get().title == "Hi"
    assert Generation.objects.get().status == Generation.Status.PENDING
    assert simulator.requests == []


def test_every_chatstream_url_is_covered_by_the_access_test():
    from chatstream import urls

    # The JSON API's (an include) has its own: tests/test_json_api.py.
    names = {f"chatstream:{p.name}" for p in urls.urlpatterns if isinstance(p, URLPattern)}
    covered = {n for n, _m, _k in OBJECT_URLS} | {
        "chatstream:conversation-list", "chatstream:conversation-create",
        "chatstream:conversation-search",
        "chatstream:data-export"}  # the user's own data only: tests/test_export.py
    assert names <= covered, f"add {names - covered} to OBJECT_URLS"


@pytest.mark.parametrize("url", ["/chat/", "/chat/search/?q=hi", f"/chat/c/{uuid.uuid4()}/",
                                 f"/chat/g/{uuid.uuid4()}/stream/"])
def test_anonymous_users_are_sent_to_login(url):
    response = Client().get(url)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize("url", ["/chat/c/not-a-uuid/", "/chat/g/123/stream/",
                                 f"/chat/c/{uuid.uuid4()}/"])
def test_malformed_or_unknown_ids_are_404(make_user, url):
    assert logged_in(make_user()).get(url).status_code == 404


def test_every_post_needs_a_csrf_token(make_user, simulator):
    user = make_user()
    generation = start_exchange(logged_in(user))
    strict = logged_in(user, enforce_csrf_checks=True)
    posts = [reverse("chatstream:conversation-create")] + [
        reverse(name, kwargs={"pk": target_of(generation, kind)})
        for name, method, kind in OBJECT_URLS if method == "post"]
    for url in posts:
        assert strict.post(url, {"content": "x", "title": "x"}).status_code == 403, url
    assert Conversation.objects.count() == 1 and Message.objects.count() == 1


@pytest.mark.parametrize("url_name", ["chatstream:conversation-create"])
def test_state_changing_urls_refuse_get(make_user, url_name):
    assert logged_in(make_user()).get(reverse(url_name)).status_code == 405


BAD_MESSAGES = [
    pytest.param({"content": ""}, "required", id="empty"),
    pytest.param({"content": "   \n  "}, "required", id="only-whitespace"),
    pytest.param({"content": "x" * 8001}, "at most 8000", id="over-long"),
    pytest.param({"content": "hi", "model": "gpt-unlisted"}, "not available",
                 id="unknown-model"),
    pytest.param({"content": "a\x00b"}, "Null characters", id="nul-character"),
]


@pytest.mark.parametrize(("data", "says"), BAD_MESSAGES)
def test_bad_message_gets_a_clear_error_and_creates_nothing(make_user, simulator, data, says):
    client = logged_in(make_user())
    conversation = client.post(reverse("chatstream:conversation-create"))["Location"]
    for htmx in (False, True):
        headers = {"HX-Request": "true"} if htmx else {}
        response = client.post(conversation + "messages/", data, headers=headers)
        assert response.status_code == 400
        assert says in response.content.decode()
    assert Message.objects.count() == 0 and Generation.objects.count() == 0
    assert simulator.requests == []


def test_forged_upstream_fields_in_the_request_are_ignored(make_user, browser_for, simulator):
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    response = browser.post(conversation + "messages/", {
        "content": "Hi", "model": "fast", "role": "system", "base_url": "http://evil.test",
        "api_base": "http://evil.test", "max_tokens": "999999", "messages": "forged",
    })
    url = response.text.split('sse-connect="')[1].split('"')[0]
    browser.client.get(url)
    body = simulator.last_request.body
    assert body["messages"] == [{"role": "user", "content": "Hi"}]
    assert body["max_tokens"] == 1024


def _key_pieces() -> set[str]:
    return {API_KEY[i:i + 8] for i in range(len(API_KEY) - 7)}


@pytest.mark.parametrize("scenario", ["fast", "http-401", "http-500", "drop?drop_after=2"])
def test_api_key_appears_in_no_response_header_or_log(make_user, browser_for, simulator, use_model,
                                                      caplog, scenario):
    simulator.register("echo-key", Script(status=401, text=f"bad key {API_KEY}"))
    model = use_model(scenario)
    user = make_user(is_staff=True, is_superuser=True)
    browser = browser_for(user)
    caplog.set_level(logging.DEBUG)
    conversation = browser.new_conversation()
    responses = [browser.client.get("/chat/"), browser.client.get(conversation)]
    stream = browser.send(conversation, "Hi", model)
    responses.append(browser.client.get(stream))
    responses.append(browser.client.get(conversation))
    responses.append(browser.client.get(f"/admin/chatstream/generation/{generation_id(stream)}/change/"))
    responses.append(browser.client.get("/admin/chatstream/generation/"))
    pieces = _key_pieces()
    for response in responses:
        blob = response.text + repr(dict(response.headers))
        assert not [p for p in pieces if p in blob], response.url
    assert not [p for p in pieces if p in caplog.text]
    generation = Generation.objects.get(pk=generation_id(stream))
    assert not [p for p in pieces if p in repr(generation.__dict__)]


def test_wsgi_requests_to_the_stream_get_an_honest_error_and_no_upstream_call(
        make_user, simulator, caplog, monkeypatch):
    """Under WSGI a stream would be buffered to its end: the reply fails at once, with its
    notice, the provider is never called, and the log says (once) what to do."""
    monkeypatch.setattr(_serving, "_told", set())  # as in a new process
    client = logged_in(make_user())
    url = reverse("chatstream:generation-stream", kwargs={"pk": start_exchange(client).pk})
    response = client.get(url)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/event-stream")
    events = [e.event for e in SSEDecoder().feed(response.content)]
    assert events == ["error", "done"]
    assert b"cannot stream replies" in response.content
    generation = Generation.objects.get()
    assert (generation.status, generation.error_type) == ("failed", "unsupported_server")
    assert simulator.requests == []
    assert "served over WSGI" in caplog.text and "uvicorn" in caplog.text
    # The same generation again: not pending any more, so a plain refusal; a second reply
    # does not log again.
    caplog.clear()
    assert client.get(url).status_code == 501
    client.get(reverse("chatstream:generation-stream", kwargs={"pk": start_exchange(client).pk}))
    assert "served over WSGI" not in caplog.text



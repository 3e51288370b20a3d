"""Every JSON API address answers whatever a client sends with JSON, never a 500: a body that is
not a JSON object, or a field of the wrong type or value, is a 400 before anything is written.

Hypothesis sends each address arbitrary bytes, arbitrary JSON values and objects holding its
fields with arbitrary values (text with NUL characters and lone surrogates included), and
arbitrary query strings, to the app served over HTTP: under uvicorn in this process on SQLite,
and in a worker process on PostgreSQL (which refuses a NUL in text).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote_from_bytes

import httpx
import pytest
from django.contrib.auth import get_user_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatstream.models import Conversation, Feedback, Generation, Message

from .conftest import Browser
from .workers import DATABASES, Workers, postgres_available

pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)

API = "/chat/api"
FUZZ = settings(max_examples=40, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])

# Text of every kind: NUL and other controls, lone surrogates, astral characters.
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=40)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT
    | st.integers(min_value=10**300, max_value=10**400),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=12)


@dataclass
class Site:
    """The app at ``url`` on database ``alias``, a signed-in user's client, and their records."""

    url: str
    alias: str
    client: httpx.Client
    csrf: str
    conversation: Conversation
    finished: Generation

    def post(self, path: str, content: bytes, content_type: str | None) -> httpx.Response:
        headers = {"X-CSRFToken": self.csrf}
        if content_type is not None:
            headers["Content-Type"] = content_type
        return self.client.post(path, content=content, headers=headers)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def site(request: Any, require_service: Any, simulator: Any) -> Iterator[Site]:
    alias = "default" if request.param == "sqlite" else "postgres"
    if alias == "postgres":
        require_service("PostgreSQL (CHATSTREAM_TEST_POSTGRES)", postgres_available)
    user = get_user_model().objects.db_manager(alias).create_user("fuzz", password="pw")
    conversation = Conversation.objects.using(alias).create(user=user, model="fast", title="t")
    message = Message.objects.using(alias).create(conversation=conversation, role="user",
                                                  content="Hi")
    finished = Generation.objects.using(alias).create(
        conversation=conversation, user=user, prompt_message=message, model="fast",
        status=Generation.Status.COMPLETED, content="Hello")
    with ExitStack() as stack:
        if alias == "default":
            url = request.getfixturevalue("asgi_server").url
        else:
            url = stack.enter_context(Workers(workers=1, alias=alias)).url
        browser = Browser(url, user)
        stack.callback(browser.close)
        yield Site(url, alias, browser.client, browser.csrf, conversation, finished)


# --- what each address takes ----------------------------------------------------------------------

# The addresses that take a body, and the fields each reads: "text" (a string or null),
# "content" (a string, required) or "rating" (required: "good", "bad" or null).
FIELDS: dict[str, dict[str, str]] = {
    "conversations": {"model": "text", "title": "text"},
    "messages": {"content": "content", "model": "text"},
    "feedback": {"rating": "rating", "comment": "text"},
    "retry": {},
    "stop": {},
}


def address(site: Site, name: str) -> str:
    generation = f"{API}/generations/{site.finished.pk}"
    return {"conversations": f"{API}/conversations/",
            "messages": f"{API}/conversations/{site.conversation.pk}/messages/",
            "feedback": f"{generation}/feedback/", "retry": f"{generation}/retry/",
            "stop": f"{generation}/stop/"}[name]


def readable_text(value: Any) -> bool:
    return isinstance(value, str) and not re.search("[\x00\ud800-\udfff]", value)


def wrong_fields(name: str, data: dict[str, Any]) -> list[str]:
    """The fields of ``data`` for which the address ``name`` must refuse it (400)."""
    wrong = []
    for field, kind in FIELDS[name].items():
        value = data.get(field, ...)
        if kind == "rating":
            if not (value is None or (isinstance(value, str) and value in ("good", "bad"))):
                wrong.append(field)
        elif (kind == "content" or value not in (..., None)) and not readable_text(value):
            wrong.append(field)
    return wrong


def assert_answered_in_json(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code < 500, response.text
    assert response.headers["content-type"] == "application/json", response.text
    data = response.json()
    assert isinstance(data, dict)
    return data


def assert_refused(response: httpx.Response, *codes: str) -> None:
    data = assert_answered_in_json(response)
    assert response.status_code == 400, response.text
    assert data["error"]["code"] in codes and data["error"]["message"]


def strict_json_object(raw: bytes) -> dict[str, Any] | None:
    """``raw`` read as RFC 8259 says (UTF-8, no NaN or Infinity), when it is an object."""
    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=refuse)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def objects_for(name: str) -> st.SearchStrategy[dict[str, Any]]:
    """Objects holding some of the fields of ``name``, each with any JSON value or a good one."""
    good = {"text": st.sampled_from(["fast", "A title"]), "content": st.just("Hello"),
            "rating": st.sampled_from(["good", "bad", None])}
    fields = {field: JSON_VALUES | good[kind] for field, kind in FIELDS[name].items()}
    return st.fixed_dictionaries({}, optional={**fields, "other": JSON_VALUES})


BODIES = st.one_of(
    st.binary(max_size=64).map(lambda raw: (raw, "application/json")),
    JSON_VALUES.map(lambda value: (json.dumps(value).encode(), "application/json")),
    st.tuples(st.binary(min_size=1, max_size=64),
              st.sampled_from(["text/plain", "application/x-www-form-urlencoded",
                               "multipart/form-data; boundary=x", "application/json5", None])),
    st.sampled_from([b"[" * 100_000, b'{"a": ' * 50_000 + b"1" + b"}" * 50_000,
                     b"1" * 5000, b'{"rating": 1e999}', b'{"rating": NaN}', b"\xef\xbb\xbf{}",
                     '{"content": "hé"}'.encode("latin-1"), '{"content": "hé"}'.encode("utf-16"),
                     b'{"content": "Hi"}\x00']).map(lambda raw: (raw, "application/json")),
)


@pytest.mark.parametrize("name", list(FIELDS))
def test_any_body_is_answered_in_json_and_one_that_is_not_a_json_object_is_a_400(site, name):
    @FUZZ
    @given(body=BODIES)
    def check(body: tuple[bytes, str | None]) -> None:
        raw, content_type = body
        response = site.post(address(site, name), raw, content_type)
        if not raw:
            assert_answered_in_json(response)
        elif content_type != "application/json":
            assert_refused(response, "unsupported_content_type")
        elif strict_json_object(raw) is None:
            assert_refused(response, "invalid_json")
        else:
            assert_answered_in_json(response)

    check()


@pytest.mark.parametrize("name", list(FIELDS))
def test_a_field_of_the_wrong_type_or_value_is_a_400_and_writes_nothing(site, name):
    @FUZZ
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        body = data.draw(objects_for(name))
        raw = json.dumps(body).encode()  # NaN and Infinity as Python writes them: not JSON
        written = _records(site)
        response = site.post(address(site, name), raw, "application/json")
        if strict_json_object(raw) is None:
            assert_refused(response, "invalid_json")
        elif wrong := wrong_fields(name, body):
            assert_refused(response, "invalid")
            assert any(field in response.json()["error"]["message"] for field in wrong)
            assert _records(site) == written
        else:
            assert_answered_in_json(response)

    check()


def _records(site: Site) -> tuple[int, int, int, int]:
    return (Conversation.objects.using(site.alias).count(),
            Message.objects.using(site.alias).count(),
            Generation.objects.using(site.alias).count(),
            Feedback.objects.using(site.alias).count())


# --- query strings --------------------------------------------------------------------------------

QUERY_VALUES = st.one_of(
    st.text(max_size=30), st.integers().map(str),
    st.sampled_from(["", "0", "-1", "1e3", "nan", "9" * 40, " 1", "\uff11", "99",
                     str(uuid.UUID(int=0)), f"{{{uuid.UUID(int=1)}}}"]))


def query_strings(*names: str) -> st.SearchStrategy[str]:
    """A query string: some of ``names`` and other keys, any text, and bytes not UTF-8."""
    keys = st.sampled_from(names) | st.text(max_size=8) if names else st.text(max_size=8)
    pair = st.tuples(keys.map(str.encode), QUERY_VALUES.map(str.encode) | st.binary(max_size=8))
    return st.lists(pair, max_size=4).map(lambda pairs: "&".join(
        f"{quote_from_bytes(k)}={quote_from_bytes(v)}" for k, v in pairs))


GETS = {
    "conversations": ("page",),
    "conversation": ("before",),
    "replies": ("before",),
    "generation": (),
    "feedback": (),
    "stream": ("after",),
}


def whole_number(value: str) -> bool:
    return value.isascii() and value.isdigit() and len(value) <= 18


def an_id(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def malformed(name: str, query: str, last_event_id: str | None) -> bool:
    """Whether the query (as Django reads it: the last of a repeated key, invalid UTF-8
    replaced) gives a number parameter of ``name`` that is not a whole number."""
    found = dict(parse_qsl(query, keep_blank_values=True, errors="replace"))
    if name == "stream":  # Last-Event-ID first, else ?after=
        value = last_event_id or found.get("after", "")
        return bool(value) and not whole_number(value)
    valid = an_id if name == "replies" else whole_number
    return any(found.get(key) and not valid(found[key]) for key in GETS[name])


@pytest.mark.parametrize("name", list(GETS))
def test_any_query_string_is_answered_and_a_number_that_is_not_one_is_a_400(site, name):
    generation = f"{API}/generations/{site.finished.pk}/"
    path = {"conversations": f"{API}/conversations/",
            "conversation": f"{API}/conversations/{site.conversation.pk}/",
            "replies": f"{API}/messages/{site.finished.prompt_message_id}/generations/",
            "generation": generation, "feedback": f"{generation}feedback/",
            "stream": f"{generation}stream/"}[name]

    @FUZZ
    @given(query=query_strings(*GETS[name]), last_event_id=st.none() | QUERY_VALUES)
    def check(query: str, last_event_id: str | None) -> None:
        headers = {}
        value = (last_event_id or "").strip()
        if name == "stream" and value and value.isascii() and value.isprintable():
            headers["Last-Event-ID"] = value
        response = site.client.get(f"{path}?{query}", headers=headers)
        if malformed(name, query, headers.get("Last-Event-ID")):
            assert_refused(response, "invalid")
        elif response.headers["content-type"].startswith("text/event-stream"):
            assert name == "stream" and response.status_code == 200
            assert "event: done" in response.text
        else:
            assert_answered_in_json(response)

    check()


# --- the cases found ------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "code"), [
    (b'{"rating": []}', "invalid"),
    (b'{"rating": {"good": 1}}', "invalid"),
    (b"{}", "invalid"),
    (b'{"rating": "good", "comment": "\\ud800"}', "invalid"),
    (b'{"rating": "good", "comment": "a\\u0000b"}', "invalid"),
    (b'{"rating": NaN}', "invalid_json"),
], ids=["rating-a-list", "rating-an-object", "no-rating", "comment-a-lone-surrogate",
        "comment-a-nul", "rating-nan"])
def test_feedback_that_is_not_a_rating_is_a_400(site, body, code):
    response = site.post(address(site, "feedback"), body, "application/json")
    assert_refused(response, code)
    assert not Feedback.objects.using(site.alias).exists()


@pytest.mark.parametrize(("name", "body"), [
    ("messages", b'{"content": "a\\u0000b"}'),
    ("messages", b'{"content": "\\udfff"}'),
    ("conversations", b'{"title": "\\ud800"}'),
    ("conversations", b'{"model": "\\u0000"}'),
    ("conversations", b'{"title": "a\\u0000b"}'),
], ids=["message-a-nul", "message-a-lone-surrogate", "title-a-lone-surrogate", "model-a-nul",
        "title-a-nul"])
def test_text_no_database_can_store_is_a_400(site, name, body):
    written = _records(site)
    assert_refused(site.post(address(site, name), body, "application/json"), "invalid")
    assert _records(site) == written


def test_a_form_posted_with_its_csrf_field_is_not_json(site):
    token = site.client.cookies["csrftoken"]
    response = site.client.post(address(site, "messages"),
                                files={"content": (None, "Hi")},
                                data={"csrfmiddlewaretoken": token})
    assert_refused(response, "unsupported_content_type")
    # Without the header the CSRF check reads the form, which has no boundary to read it by.
    broken = site.client.post(address(site, "messages"), content=b"content=Hi",
                              headers={"Content-Type": "multipart/form-data"})
    assert_refused(broken, "invalid")

"""Who may chat, and with which models (``CHATSTREAM_ACCESS``), through the pages and
``chatstream.api``."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import PermissionDenied
from django.test import Client
from django.urls import reverse

from chatstream import api
from chatstream.models import Conversation, Generation, Message

from . import hooks_for_tests as hooks
from .conftest import read_events

pytestmark = pytest.mark.django_db(transaction=True)

Status = Generation.Status
NOT_AVAILABLE = "This model is not available."
MODELS = ["fast", "smart", "mini"]  # the settings' order


@pytest.fixture(autouse=True)
def three_models(settings: Any) -> Any:
    hooks.reset()
    settings.CHATSTREAM_MODELS = {
        key: {"PROVIDER": "default", "MODEL": "fast", "LABEL": key.title()} for key in MODELS}
    settings.CHATSTREAM_ACCESS = hooks.ACCESS
    yield settings
    hooks.reset()


def allow(username: str, verdict: Any) -> None:
    hooks.state.access[username] = verdict


def client_for(user: Any, *, htmx: bool = False) -> Client:
    client = Client(headers={"HX-Request": "true"} if htmx else {})
    client.force_login(user)
    return client


def url(name: str, pk: Any = None) -> str:
    return reverse(f"chatstream:{name}", kwargs={"pk": pk} if pk is not None else None)


def offered(page: str) -> list[str]:
    """The model keys the page's composer offers (none: no choice shown)."""
    select = re.search(r'<select name="model".*?</select>', page, re.DOTALL)
    return re.findall(r'<option value="([^"]+)"', select.group(0)) if select else []


VERDICTS = [
    pytest.param(True, MODELS, id="true-every-model"),
    pytest.param(["smart", "mini"], ["smart", "mini"], id="list-of-keys"),
    pytest.param(("mini", "fast"), ["fast", "mini"], id="tuple-in-settings-order"),
    pytest.param({"mini", "smart", "gone"}, ["smart", "mini"], id="set-with-an-unknown-key"),
    pytest.param("smart", ["smart"], id="single-string"),
]


@pytest.mark.parametrize(("verdict", "models"), VERDICTS)
def test_the_composer_offers_only_the_users_models(make_user, simulator, verdict, models):
    user = make_user()
    allow("alice", verdict)
    conversation = Conversation.objects.create(user=user, model=models[0])
    page = client_for(user).get(url("conversation-detail", conversation.pk))
    assert page.status_code == 200
    # One model is no choice: the composer shows no select then.
    assert offered(page.content.decode()) == (models if len(models) > 1 else [])


@pytest.mark.parametrize(("verdict", "models"), VERDICTS)
def test_each_of_the_users_models_is_accepted_and_reaches_the_upstream(
    make_user, simulator, verdict, models
):
    user = make_user()
    allow("alice", verdict)
    client = client_for(user, htmx=True)
    conversation = Conversation.objects.create(user=user, model=models[0])
    for key in models:
        response = client.post(url("message-create", conversation.pk),
                               {"content": f"Hello {key}", "model": key})
        assert response.status_code == 200, response.content
        assert Generation.objects.latest("created_at").model == key


@pytest.mark.parametrize(("verdict", "models"), VERDICTS[1:])
@pytest.mark.parametrize("htmx", [True, False], ids=["htmx", "plain"])
def test_posting_a_model_that_is_not_the_users_is_a_400_with_the_form_error(
    make_user, simulator, verdict, models, htmx
):
    user = make_user()
    allow("alice", verdict)
    conversation = Conversation.objects.create(user=user, model=models[0])
    for key in sorted(set(MODELS) - set(models)):
        response = client_for(user, htmx=htmx).post(url("message-create", conversation.pk),
                                                     {"content": "Hello", "model": key})
        assert response.status_code == 400
        assert NOT_AVAILABLE in html.unescape(response.content.decode())
        created = client_for(user).post(url("conversation-create"), {"model": key})
        assert created.status_code == 400
        assert NOT_AVAILABLE in created.content.decode()
    assert not Message.objects.exists() and not Generation.objects.exists()
    assert Conversation.objects.count() == 1
    assert simulator.requests == []


def test_the_python_api_refuses_a_model_that_is_not_the_users(make_user, simulator):
    user = make_user()
    allow("alice", ["mini"])
    with pytest.raises(PermissionDenied):
        api.send(user, "Hello", model="fast")
    assert api.send(user, "Hello", model="mini").model == "mini"
    assert api.send(user, "Hello").model == "mini"


DENIED = [pytest.param(False, id="false"), pytest.param([], id="empty-list"),
          pytest.param(set(), id="empty-set"), pytest.param(["unknown"], id="no-allowed-key")]

PAGES = [
    ("conversation-list", "get", None),
    ("conversation-create", "post", None),
    ("conversation-search", "get", None),
    ("conversation-detail", "get", "conversation"),
    ("conversation-rename", "post", "conversation"),
    ("conversation-delete", "get", "conversation"),
    ("conversation-delete", "post", "conversation"),
    ("message-create", "post", "conversation"),
    ("generation-retry", "post", "generation"),
]
PAGE_IDS = [f"{method}-{name}" for name, method, _kind in PAGES]


@pytest.fixture
def denied_users_exchange(make_user: Any, simulator: Any) -> Generation:
    """alice's finished exchange, made while she could still chat."""
    user = make_user()
    generation = api.run(api.send(user, "Hello"))
    assert generation.status == Status.COMPLETED
    simulator.reset()
    return generation


@pytest.mark.parametrize("verdict", DENIED)
@pytest.mark.parametrize(("name", "method", "kind"), PAGES, ids=PAGE_IDS)
def test_a_denied_user_gets_403_on_every_page_and_nothing_changes(
    denied_users_exchange, simulator, verdict, name, method, kind
):
    generation = denied_users_exchange
    allow("alice", verdict)
    pk = {"conversation": generation.conversation_id, "generation": generation.pk}.get(kind or "")
    for htmx in (False, True):
        response = getattr(client_for(generation.user, htmx=htmx), method)(
            url(name, pk), {"content": "Hello again", "title": "Renamed", "model": "fast"})
        assert response.status_code == 403
    assert Conversation.objects.count() == 1
    assert Conversation.objects.get().title == "Hello"
    assert Message.objects.count() == 2 and Generation.objects.count() == 1
    assert simulator.requests == []


@pytest.mark.parametrize("verdict", DENIED)
def test_the_python_api_refuses_a_denied_user(denied_users_exchange, simulator, verdict):
    generation = denied_users_exchange
    allow("alice", verdict)
    with pytest.raises(PermissionDenied):
        api.send(generation.user, "Hello again")
    with pytest.raises(PermissionDenied):
        api.send(generation.user, "Hello again", conversation=generation.conversation)
    with pytest.raises(PermissionDenied):
        api.retry(generation)
    assert Generation.objects.count() == 1
    assert simulator.requests == []


def test_a_reply_admitted_before_access_was_withdrawn_still_streams_to_its_end(
    make_user, browser_for, simulator
):
    user = make_user()
    browser = browser_for(user)
    conversation = browser.new_conversation()
    stream_url = browser.send(conversation, "Hello", "fast")
    allow("alice", False)
    with browser.client.stream("GET", stream_url) as response:
        assert response.status_code == 200
        names = [name for _at, name, _data in read_events(response)]
    assert names[-1] == "done" and "delta" in names
    assert Generation.objects.get().status == Status.COMPLETED


def test_a_denied_user_can_still_stop_a_reply_admitted_before(
    make_user, browser_for, simulator, use_model
):
    settings_model = use_model("default?tps=20&first_token_delay=0")
    user = make_user()
    browser = browser_for(user)
    stream_url = browser.send(browser.new_conversation(), "Hello", settings_model)
    allow("alice", False)
    with browser.client.stream("GET", stream_url) as response:
        names = []
        for _at, name, _data in read_events(response):
            names.append(name)
            if names.count("delta") == 1:
                cancel = browser.post(stream_url.split("?")[0].replace("/stream/", "/cancel/"))
                assert cancel.status_code == 204
    assert names[-1] == "done"
    assert Generation.objects.get().status == Status.CANCELLED


def test_the_default_model_falls_back_to_the_users_first_when_it_is_not_theirs(
    settings, make_user, simulator
):
    settings.CHATSTREAM_DEFAULT_MODEL = "fast"
    user = make_user()
    allow("alice", ["mini", "smart"])  # in the settings' order, smart comes first
    response = client_for(user).post(url("conversation-create"))
    assert response.status_code == 302
    conversation = Conversation.objects.get()
    assert conversation.model == "smart"
    posted = client_for(user, htmx=True).post(url("message-create", conversation.pk),
                                              {"content": "Hello", "model": ""})
    assert posted.status_code == 200, posted.content
    assert Generation.objects.get().model == "smart"
    assert api.send(user, "Hello").model == "smart"
    # A user the default model is open to gets it.
    bob = make_user("bob")
    assert api.send(bob, "Hello").model == "fast"


def test_a_retry_of_a_model_no_longer_the_users_uses_their_default_one(
    denied_users_exchange, simulator
):
    original = denied_users_exchange
    assert original.model == "fast"
    allow("alice", ["mini"])
    response = client_for(original.user, htmx=True).post(url("generation-retry", original.pk))
    assert response.status_code == 200, response.content
    retried = Generation.objects.latest("created_at")
    assert retried.retry_of_id == original.pk and retried.model == "mini"


@pytest.mark.parametrize(("name", "method", "kind"), PAGES, ids=PAGE_IDS)
def test_anonymous_users_still_get_the_login_redirect(
    denied_users_exchange, name, method, kind
):
    generation = denied_users_exchange
    allow("alice", False)
    calls = hooks.state.access_calls
    pk = {"conversation": generation.conversation_id, "generation": generation.pk}.get(kind or "")
    response = getattr(Client(), method)(url(name, pk))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse(django_settings.LOGIN_URL))
    assert hooks.state.access_calls == calls  # the callable is never asked about nobody


def test_the_python_api_keeps_a_conversations_model_while_it_is_the_users_then_falls_back(
    make_user, simulator
):
    user = make_user()
    allow("alice", ["smart", "mini"])
    first = api.send(user, "Hello", model="mini")
    # No model named: the conversation's own, while the user may use it.
    assert api.send(user, "Again", conversation=first.conversation).model == "mini"
    allow("alice", ["smart"])
    user = type(user).objects.get(pk=user.pk)  # the access callable's answer is per user object
    # Taken away since: the user's default one, not a refusal.
    assert api.send(user, "And again", conversation=first.conversation).model == "smart"

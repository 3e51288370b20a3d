"""A finished reply's details: model, tokens (estimates labelled), timings, finish reason."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.template.loader import render_to_string
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from chatstream.models import Conversation, Generation, Message

pytestmark = pytest.mark.django_db


def _details(generation: Generation) -> dict[str, str]:
    html = render_to_string("chatstream/includes/generation.html",
                            {"generation": generation, "final": True})
    block = re.search(r'<details class="cs-details">(.*?)</details>', html, re.S)
    assert block, html
    terms = re.findall(r"<dt>(.*?)</dt>\s*<dd>(.*?)</dd>", block.group(1), re.S)
    return {term: re.sub(r"<[^>]+>", "", value).strip() for term, value in terms}


def _generation(user: Any, **fields: Any) -> Generation:
    conversation = fields.pop("conversation", None) or Conversation.objects.create(
        user=user, model="test")
    message = fields.pop("prompt_message", None) or Message.objects.create(
        conversation=conversation, role="user", content="Hi")
    started = timezone.now() - timedelta(seconds=10)
    values: dict[str, Any] = {
        "conversation": conversation, "user": user, "prompt_message": message, "model": "test",
        "status": "completed", "content": "Hello.", "started_at": started,
        "first_token_at": started + timedelta(milliseconds=420),
        "completed_at": started + timedelta(seconds=3, milliseconds=250),
        "finish_reason": "stop", "provider_model": "sim-1",
        "prompt_tokens": 120, "cached_tokens": 64, "completion_tokens": 40,
        "usage_source": "provider",
    }
    values.update(fields)
    return Generation.objects.create(**values)


def test_details_name_the_model_tokens_timings_and_finish_reason(make_user, use_model):
    use_model("default")
    details = _details(_generation(make_user("ann"), reasoning_tokens=12))
    assert details["Model"] == "test (sim-1)"
    assert details["Prompt tokens"] == "120 (64 cached)"
    assert details["Reply tokens"] == "40 (12 thinking)"
    assert details["Time to first token"] == "0.42 s"
    assert details["Duration"] == "3.25 s"
    assert details["Finish reason"] == "stop (the model finished)"


def test_estimated_token_counts_say_so(make_user):
    details = _details(_generation(make_user("ann"), usage_source="estimated",
                                   cached_tokens=None))
    assert details["Prompt tokens"] == "120 estimated"
    assert details["Reply tokens"] == "40 estimated"


def test_a_reply_that_never_started_shows_only_what_is_known(make_user):
    details = _details(_generation(
        make_user("ann"), status="failed", content="", started_at=None, first_token_at=None,
        finish_reason="", prompt_tokens=None, completion_tokens=None, provider_model=""))
    assert list(details) == ["Model"]


def test_a_model_no_longer_allowed_is_named_by_its_key(make_user, settings):
    settings.CHATSTREAM_MODELS = {"other": {"PROVIDER": "default", "MODEL": "x"}}
    settings.CHATSTREAM_DEFAULT_MODEL = "other"
    assert _details(_generation(make_user("ann"), model="gone"))["Model"] == "gone (sim-1)"


def test_an_unknown_finish_reason_is_shown_as_the_provider_said_it(make_user):
    finish = "<b>odd</b>"
    html = render_to_string("chatstream/includes/generation.html", {
        "generation": _generation(make_user("ann"), finish_reason=finish), "final": True})
    assert "&lt;b&gt;odd&lt;/b&gt;" in html
    assert "<b>odd</b>" not in html


# --- a reply a fallback answered -----------------------------------------------------------------


def _models(settings: Any, **labels: str) -> None:
    settings.CHATSTREAM_MODELS = {
        key: {"PROVIDER": "default", "MODEL": key, "LABEL": label}
        for key, label in labels.items()}


def test_a_reply_a_fallback_answered_names_it_and_the_model_it_stood_in_for(make_user, settings):
    _models(settings, fast="Fast", spare="Spare")
    details = _details(_generation(make_user("ann"), model="fast", answered_by="spare"))
    assert details["Answered by"] == "Spare, standing in for Fast"
    assert list(details)[:2] == ["Model", "Answered by"]


@pytest.mark.parametrize("answered_by", ["", "fast"])
def test_a_reply_the_model_asked_answered_says_nothing_more(make_user, settings, answered_by):
    _models(settings, fast="Fast", spare="Spare")
    details = _details(_generation(make_user("ann"), model="fast", answered_by=answered_by))
    assert "Answered by" not in details


def test_the_labels_are_escaped_and_a_model_gone_from_the_settings_is_its_key(make_user,
                                                                              settings):
    _models(settings, spare="<b>Spare</b> & co")
    html = render_to_string("chatstream/includes/generation.html", {
        "generation": _generation(make_user("ann"), model="gone", answered_by="spare"),
        "final": True})
    assert "&lt;b&gt;Spare&lt;/b&gt; &amp; co, standing in for gone" in html
    assert "<b>Spare</b>" not in html


def test_the_conversation_page_says_so_without_a_query_per_reply(client, make_user, settings):
    _models(settings, fast="Fast", spare="Spare")
    ann = make_user("ann")
    first = _generation(ann, model="fast", answered_by="spare")
    conversation = first.conversation
    url = conversation.get_absolute_url()
    client.force_login(ann)
    with CaptureQueriesContext(connection) as one:
        html = client.get(url).content.decode()
    assert html.count("Spare, standing in for Fast") == 1
    for answered_by in ("spare", "spare", "fast"):
        message = Message.objects.create(conversation=conversation, role="user", content="Hi")
        _generation(ann, model="fast", answered_by=answered_by, conversation=conversation,
                    prompt_message=message)
    with CaptureQueriesContext(connection) as four:
        html = client.get(url).content.decode()
    assert html.count("Spare, standing in for Fast") == 3
    assert len(four) == len(one)

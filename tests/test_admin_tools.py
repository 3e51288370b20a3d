"""The admin's tool calls: a generation's calls on its page, each call's own page with its text
behind the content permission, the list filtered by tool and status; records, never edited."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.urls import reverse

from chatstream.models import Generation, ToolCall

from .test_admin import HIDDEN, admin_client_for, alice, make_generation, staff  # noqa: F401

pytestmark = pytest.mark.django_db

METADATA = ("view_generation", "view_toolcall")
CONTENT = (*METADATA, "view_generation_content")
CHANGELIST = "admin:chatstream_toolcall_changelist"


def calls_of(generation: Generation) -> list[ToolCall]:
    return [
        ToolCall.objects.create(generation=generation, position=0, call_id="call_a",
                                name="order_status", arguments='{"order_id": 7123}',
                                status=ToolCall.Status.SUCCEEDED,
                                result='{"status": "shipped to Lyon"}'),
        ToolCall.objects.create(generation=generation, position=1, call_id="call_b",
                                name="refund", arguments='{"order_id": 7123, "reason": "late"}',
                                status=ToolCall.Status.FAILED, result="No such order.",
                                error="ToolError: <b>No such order.</b>"),
    ]


def test_a_generations_page_lists_its_calls_without_their_text(
        admin_client_for: Callable[..., Any], alice: Any) -> None:  # noqa: F811
    first = make_generation(alice, finish_reason="tool_calls")
    second = make_generation(alice, conversation=first.conversation, step=2, follows=first)
    calls = calls_of(first)
    html = admin_client_for(*CONTENT).get(
        reverse("admin:chatstream_generation_change", args=[first.pk])).content.decode()
    assert "order_status" in html and "refund" in html
    assert "7123" not in html and "shipped to Lyon" not in html  # on each call's own page
    for call in calls:
        assert reverse("admin:chatstream_toolcall_change", args=[call.pk]) in html
    html = admin_client_for(*CONTENT).get(
        reverse("admin:chatstream_generation_change", args=[second.pk])).content.decode()
    assert reverse("admin:chatstream_generation_change", args=[first.pk]) in html  # follows


def test_a_calls_text_is_shown_with_the_content_permission_only_and_its_reading_logged(
        admin_client_for: Callable[..., Any], alice: Any, caplog: Any) -> None:  # noqa: F811
    call = calls_of(make_generation(alice))[1]
    url = reverse("admin:chatstream_toolcall_change", args=[call.pk])
    with caplog.at_level("INFO", logger="chatstream.admin"):
        html = admin_client_for(*METADATA).get(url).content.decode()
    assert "7123" not in html and "No such order" not in html and HIDDEN in html
    assert "refund" in html and "failed" in html.lower()
    assert not caplog.records
    with caplog.at_level("INFO", logger="chatstream.admin"):
        html = admin_client_for(*CONTENT).get(url).content.decode()
    assert "7123" in html and "No such order." in html
    assert "&lt;b&gt;No such order.&lt;/b&gt;" in html and "<b>No such" not in html
    assert [r.getMessage() for r in caplog.records if f"tool_call={call.pk}" in r.getMessage()]


def test_the_list_filters_by_tool_and_status_and_refuses_text_lookups_without_permission(
        admin_client_for: Callable[..., Any], alice: Any) -> None:  # noqa: F811
    status_call, refund_call = calls_of(make_generation(alice))
    client = admin_client_for(*METADATA)

    def listed(**query: str) -> set[Any]:
        response = client.get(reverse(CHANGELIST), query)
        assert response.status_code == 200
        return {call.pk for call in response.context["cl"].result_list}

    assert listed() == {status_call.pk, refund_call.pk}
    assert listed(name="refund") == {refund_call.pk}
    assert listed(status__exact="succeeded") == {status_call.pk}
    html = client.get(reverse(CHANGELIST)).content.decode()
    assert "?name=order_status" in html  # the tool filter offers the tools seen
    assert client.get(reverse(CHANGELIST), {"arguments__contains": "7123"}).status_code == 400
    client = admin_client_for(*CONTENT)
    assert client.get(reverse(CHANGELIST), {"arguments__contains": "7123"}).status_code == 200


def test_calls_are_records_nobody_adds_changes_or_deletes_here(admin_client: Any,
                                                                alice: Any) -> None:  # noqa: F811
    call = calls_of(make_generation(alice))[0]
    assert admin_client.get(reverse("admin:chatstream_toolcall_add")).status_code == 403
    response = admin_client.post(reverse("admin:chatstream_toolcall_change", args=[call.pk]),
                                 {"name": "other", "status": "running"})
    assert response.status_code == 403
    call.refresh_from_db()
    assert (call.name, call.status) == ("order_status", "succeeded")
    assert admin_client.post(reverse("admin:chatstream_toolcall_delete", args=[call.pk]),
                             {"post": "yes"}).status_code == 403
    assert ToolCall.objects.filter(pk=call.pk).exists()


def test_a_generations_page_shows_the_tool_calls_and_results_it_sent_upstream(
        admin_client: Any, alice: Any) -> None:  # noqa: F811
    sent = [
        {"role": "user", "content": "Where is order 7?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function",
             "function": {"name": "order_status", "arguments": '{"note": "<b>7</b>"}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "shipped"},
    ]
    generation = make_generation(alice, upstream_messages=sent, step=2)
    html = admin_client.get(reverse("admin:chatstream_generation_change",
                                    args=[generation.pk])).content.decode()
    assert "order_status({&quot;note&quot;: &quot;&lt;b&gt;7&lt;/b&gt;&quot;})" in html
    assert "result of call_a" in html and "shipped" in html
    assert ">None<" not in html and "None\n" not in html

"""The admin: generation list, detail, conversation pages, summary, exports and privacy."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection, connections
from django.http import StreamingHttpResponse
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from chatstream.admin import chart, exports, summary
from chatstream.models import Conversation, Generation, Message

pytestmark = pytest.mark.django_db

Status = Generation.Status
CHANGELIST = "admin:chatstream_generation_changelist"
HIDDEN = "hidden: you lack the permission"


def make_generation(user: Any, *, prompt: str = "What is SSE?", content: str = "A stream.",
                    conversation: Conversation | None = None, created_at: datetime | None = None,
                    ttft_ms: int | None = 120, duration_ms: int | None = 900,
                    using: str = "default", **fields: Any) -> Generation:
    """One exchange as the app stores it: a user message, a generation, its reply message."""
    created = created_at or timezone.now()
    if conversation is None:
        conversation = Conversation.objects.using(using).create(
            user=user, title=prompt[:40], created_at=created, updated_at=created)
    message = Message.objects.using(using).create(
        conversation=conversation, role=Message.Role.USER, content=prompt, created_at=created)
    started = created + timedelta(milliseconds=5)
    fields.setdefault("status", Status.COMPLETED)
    generation = Generation.objects.using(using).create(
        conversation=conversation, user=user, prompt_message=message, content=content,
        model=fields.pop("model", "fast"), created_at=created, started_at=started,
        first_token_at=None if ttft_ms is None else started + timedelta(milliseconds=ttft_ms),
        completed_at=(None if duration_ms is None
                      else started + timedelta(milliseconds=duration_ms)),
        **fields,
    )
    if content:
        Message.objects.using(using).create(
            conversation=conversation, role=Message.Role.ASSISTANT, content=content,
            generation=generation, created_at=created + timedelta(seconds=1))
    return generation


def bulk_generations(user: Any, count: int) -> None:
    """``count`` generations in one conversation, cheaply (for the query-count tests)."""
    conversation = Conversation.objects.create(user=user, title="bulk")
    now = timezone.now()
    messages = Message.objects.bulk_create(
        Message(conversation=conversation, role=Message.Role.USER, content=f"q{i}",
                created_at=now - timedelta(minutes=i))
        for i in range(count)
    )
    Generation.objects.bulk_create(
        Generation(conversation=conversation, user=user, prompt_message=message, model="fast",
                   status=Status.COMPLETED, content="reply " * 50, created_at=message.created_at,
                   started_at=message.created_at,
                   first_token_at=message.created_at + timedelta(milliseconds=80),
                   completed_at=message.created_at + timedelta(seconds=2), prompt_tokens=10,
                   completion_tokens=20, usage_source="provider", http_status=200,
                   tool_calls=[{"id": "t"}])
        for message in messages
    )


@pytest.fixture
def alice() -> Any:
    return get_user_model().objects.create_user("alice", "alice@example.com", "pw")


@pytest.fixture
def bob() -> Any:
    return get_user_model().objects.create_user("bob", "bob@example.org", "pw")


@pytest.fixture
def staff() -> Callable[..., Any]:
    """A staff member holding exactly the given chatstream permissions (codenames)."""

    made = iter(range(1000))

    def make(*codenames: str) -> Any:
        user = get_user_model().objects.create_user(f"reviewer{next(made)}", password="pw",
                                                    is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="chatstream",
                                      codename__in=codenames)
        )
        return get_user_model().objects.get(pk=user.pk)  # no stale permission cache

    return make


METADATA = ("view_generation", "view_conversation", "view_message")
CONTENT = (*METADATA, "view_generation_content")


@pytest.fixture
def admin_client_for(client: Any, staff: Callable[..., Any]) -> Callable[..., Any]:
    def login(*codenames: str) -> Any:
        client.force_login(staff(*codenames))
        return client

    return login


def listed(response: Any) -> set[Any]:
    return {generation.pk for generation in response.context["cl"].result_list}


# --- the list ------------------------------------------------------------------------------------


def test_list_shows_the_review_columns(admin_client: Any, alice: Any) -> None:
    make_generation(alice, ttft_ms=250, duration_ms=1500, prompt_tokens=11, cached_tokens=3,
                    completion_tokens=42, usage_source="provider", http_status=200,
                    finish_reason="stop", error_type="")
    response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    html = response.content.decode()
    for header in ("Created", "User", "Conversation", "Model", "Status", "Finish reason",
                   "TTFT (ms)", "Duration (s)", "Prompt tokens", "Cached tokens",
                   "Completion tokens", "Usage source", "HTTP status", "Error type"):
        assert f">{header}<" in html.replace("</a>", "<"), header
    row = html[html.index('<tbody>'):]
    for value in (">alice<", ">250<", ">1.5<", ">11<", ">3<", ">42<", ">provider<", ">200<",
                  ">stop<"):
        assert value in row, value
    assert "Summary" in html and "Export CSV" in html and "Export JSON Lines" in html


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"status__exact": "failed"}, {"failed"}),
        ({"model": "slow"}, {"slow"}),
        ({"usage_source__exact": "estimated"}, {"estimated"}),
        ({"error_type": "http_error"}, {"failed"}),
        ({"created_at__year": "2024"}, {"old"}),
    ],
    ids=["status", "model", "usage-source", "error-type", "date-hierarchy"],
)
def test_each_filter_narrows_the_list(admin_client: Any, alice: Any, query: dict[str, str],
                                      expected: set[str]) -> None:
    rows = {
        "failed": make_generation(alice, status=Status.FAILED, error_type="http_error",
                                  http_status=500, content="", ttft_ms=None),
        "slow": make_generation(alice, model="slow"),
        "estimated": make_generation(alice, usage_source="estimated"),
        "old": make_generation(alice, created_at=datetime(2024, 5, 1, 12, tzinfo=UTC)),
    }
    response = admin_client.get(reverse(CHANGELIST), query)
    assert response.status_code == 200
    assert listed(response) == {rows[name].pk for name in expected}


def test_date_filter_keeps_the_period(admin_client: Any, alice: Any) -> None:
    recent = make_generation(alice)
    make_generation(alice, created_at=timezone.now() - timedelta(days=40))
    since = (timezone.now() - timedelta(days=7)).isoformat()
    response = admin_client.get(reverse(CHANGELIST), {"created_at__gte": since})
    assert listed(response) == {recent.pk}


def test_filters_offer_the_models_and_error_types_present(admin_client: Any, alice: Any
                                                          ) -> None:
    make_generation(alice, model="m-one", error_type="stall")
    make_generation(alice, model="m-two", error_type="")
    html = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "?model=m-one" in html and "?model=m-two" in html
    assert "?model=fast" in html  # in CHATSTREAM_MODELS, not used yet
    assert "?error_type=stall" in html and "?error_type=&" not in html


def test_date_drill_down_offers_the_span_of_the_list(admin_client: Any, alice: Any) -> None:
    make_generation(alice, created_at=datetime(2024, 11, 3, tzinfo=UTC))
    make_generation(alice, created_at=datetime(2025, 2, 1, tzinfo=UTC))
    html = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "?created_at__year=2024" in html and "?created_at__year=2025" in html
    html = admin_client.get(reverse(CHANGELIST), {"created_at__year": "2024"}).content.decode()
    assert "created_at__month=11" in html and "created_at__month=10" not in html


def test_date_drill_down_goes_to_the_days_of_a_month_and_to_one_day(admin_client: Any,
                                                                      alice: Any) -> None:
    third = make_generation(alice, created_at=datetime(2024, 11, 3, 12, tzinfo=UTC))
    make_generation(alice, created_at=datetime(2024, 11, 20, 12, tzinfo=UTC))
    make_generation(alice, created_at=datetime(2025, 2, 1, 12, tzinfo=UTC))
    month = {"created_at__year": "2024", "created_at__month": "11"}
    response = admin_client.get(reverse(CHANGELIST), month)
    hierarchy = response.context["date_hierarchy"]
    days = [choice["link"] for choice in hierarchy["choices"]]
    assert len(days) == 18  # the 3rd to the 20th: the days the list spans in that month
    assert "created_at__day=3" in days[0] and "created_at__day=20" in days[-1]
    assert "created_at__month" not in hierarchy["back"]["link"]  # back: the year's months
    assert "created_at__year=2024" in hierarchy["back"]["link"]

    response = admin_client.get(reverse(CHANGELIST), {**month, "created_at__day": "3"})
    assert listed(response) == {third.pk}
    hierarchy = response.context["date_hierarchy"]
    assert [set(choice) for choice in hierarchy["choices"]] == [{"title"}]  # no link further
    assert "created_at__month=11" in hierarchy["back"]["link"]
    assert "created_at__day" not in hierarchy["back"]["link"]
    assert "November" in hierarchy["back"]["title"]


@pytest.mark.parametrize("term", ["ali", "alice@example", "req-abc-123"],
                         ids=["username", "email", "request-id"])
def test_search_finds_generations_by_user_or_request_id(admin_client: Any, alice: Any,
                                                        bob: Any, term: str) -> None:
    mine = make_generation(alice, request_id="req-abc-123")
    make_generation(bob, request_id="req-other")
    response = admin_client.get(reverse(CHANGELIST), {"q": term})
    assert listed(response) == {mine.pk}


def test_search_words_must_all_match_and_quotes_keep_phrases(
    admin_client_for: Callable[..., Any], alice: Any, bob: Any
) -> None:
    both = make_generation(alice, content="the red fox")
    make_generation(bob, content="the red hen")
    client = admin_client_for(*CONTENT)
    assert listed(client.get(reverse(CHANGELIST), {"q": "alice red"})) == {both.pk}
    assert listed(client.get(reverse(CHANGELIST), {"q": '"red fox"'})) == {both.pk}
    assert listed(client.get(reverse(CHANGELIST), {"q": '"fox red"'})) == set()


def test_search_by_generation_or_conversation_id(admin_client: Any, alice: Any) -> None:
    one = make_generation(alice)
    make_generation(alice)
    assert listed(admin_client.get(reverse(CHANGELIST), {"q": str(one.pk)})) == {one.pk}
    assert listed(admin_client.get(reverse(CHANGELIST),
                                   {"q": str(one.conversation_id)})) == {one.pk}


def test_text_search_needs_the_content_permission(admin_client_for: Callable[..., Any],
                                                  alice: Any) -> None:
    asked = make_generation(alice, prompt="tell me about pelicans", content="They fly.")
    answered = make_generation(alice, prompt="hello", content="Pelicans are birds.")
    client = admin_client_for(*METADATA)
    assert listed(client.get(reverse(CHANGELIST), {"q": "pelicans"})) == set()
    client = admin_client_for(*CONTENT)
    assert listed(client.get(reverse(CHANGELIST), {"q": "pelicans"})) == {asked.pk, answered.pk}


@pytest.mark.parametrize("lookup", ["content__icontains", "tool_calls__icontains"])
def test_content_lookups_in_the_url_are_refused_without_permission(
    admin_client_for: Callable[..., Any], alice: Any, lookup: str
) -> None:
    make_generation(alice, content="secret plan")
    url = reverse(CHANGELIST)
    assert admin_client_for(*METADATA).get(url, {lookup: "secret"}).status_code == 400
    assert admin_client_for(*CONTENT).get(url, {lookup: "secret"}).status_code == 200


def test_list_page_costs_the_same_queries_for_100_and_150_rows(admin_client: Any,
                                                               alice: Any) -> None:
    url = reverse(CHANGELIST)
    admin_client.get(url)  # warm caches (content types, sessions)
    bulk_generations(alice, 100)
    with CaptureQueriesContext(connection) as hundred:
        assert admin_client.get(url).status_code == 200
    bulk_generations(alice, 50)
    with CaptureQueriesContext(connection) as hundred_and_fifty:
        response = admin_client.get(url)
    assert len(response.context["cl"].result_list) == 100
    assert len(hundred_and_fifty) == len(hundred) <= 12
    # Never a COUNT(*) of the whole table beside the page's own count.
    counts = [q["sql"] for q in hundred_and_fifty.captured_queries if "COUNT(" in q["sql"]]
    assert len(counts) == 1
    # The list never loads the reply text.
    page_query = next(q["sql"] for q in hundred_and_fifty.captured_queries
                      if "LIMIT 100" in q["sql"])
    assert '"chatstream_generation"."content"' not in page_query


# --- read-only ---------------------------------------------------------------------------------


@pytest.mark.parametrize("object_id", ["00000000-0000-4000-8000-000000000000", "not-an-id"],
                         ids=["deleted", "malformed"])
def test_the_page_of_a_generation_that_is_not_there_says_so(admin_client: Any, alice: Any,
                                                             object_id: str) -> None:
    make_generation(alice)
    response = admin_client.get(reverse("admin:chatstream_generation_change",
                                        args=[object_id]), follow=True)
    assert response.redirect_chain[0] == (reverse("admin:index"), 302)
    said = [str(message) for message in response.context["messages"]]
    assert said == [f"generation with ID \u201c{object_id}\u201d doesn\u2019t exist. "
                    "Perhaps it was deleted?"]


def test_generations_are_viewed_never_added_changed_or_deleted(admin_client: Any,
                                                               alice: Any) -> None:
    generation = make_generation(alice, content="kept as it was")
    change = reverse("admin:chatstream_generation_change", args=[generation.pk])
    assert admin_client.get(change).status_code == 200
    assert admin_client.get(reverse("admin:chatstream_generation_add")).status_code == 403
    assert admin_client.post(change, {"content": "edited", "status": "failed"}).status_code == 403
    delete = reverse("admin:chatstream_generation_delete", args=[generation.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    generation.refresh_from_db()
    assert generation.content == "kept as it was" and generation.status == Status.COMPLETED
    listing = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert reverse("admin:chatstream_generation_add") not in listing
    assert 'name="action"' not in listing  # no bulk delete


def test_conversations_are_read_only_too(admin_client: Any, alice: Any) -> None:
    conversation = make_generation(alice).conversation
    change = reverse("admin:chatstream_conversation_change", args=[conversation.pk])
    assert admin_client.get(change).status_code == 200
    assert admin_client.post(change, {"title": "edited"}).status_code == 403
    delete = reverse("admin:chatstream_conversation_delete", args=[conversation.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert Conversation.objects.filter(pk=conversation.pk).exists()


def test_staff_without_view_permission_see_nothing(admin_client_for: Callable[..., Any],
                                                   alice: Any) -> None:
    generation = make_generation(alice)
    client = admin_client_for("view_conversation")
    for url in (reverse(CHANGELIST),
                reverse("admin:chatstream_generation_change", args=[generation.pk]),
                reverse("admin:chatstream_generation_summary"),
                reverse("admin:chatstream_generation_export_csv"),
                reverse("admin:chatstream_generation_export_jsonl")):
        assert client.get(url).status_code == 403, url


def test_non_staff_are_sent_to_the_login_page(client: Any, alice: Any) -> None:
    client.force_login(alice)
    response = client.get(reverse("admin:chatstream_generation_summary"))
    assert response.status_code == 302 and "login" in response["Location"]


# --- the detail page and privacy ------------------------------------------------------------------


def _exchange(alice: Any) -> Generation:
    first = make_generation(alice, prompt="first question", content="first answer",
                            created_at=timezone.now() - timedelta(minutes=5))
    return make_generation(alice, conversation=first.conversation, prompt="second question",
                           content="second answer", request_id="req-7",
                           tool_calls=[{"id": "call_1", "function": {"name": "lookup",
                                                                     "arguments": "{}"}}],
                           worker="host:42", reason="", finish_reason="tool_calls")


def test_detail_shows_what_was_sent_upstream_and_the_reply(
    admin_client_for: Callable[..., Any], alice: Any, settings: Any
) -> None:
    settings.CHATSTREAM_SYSTEM_PROMPT = "Be brief."
    generation = _exchange(alice)
    client = admin_client_for(*CONTENT)
    html = client.get(reverse("admin:chatstream_generation_change",
                              args=[generation.pk])).content.decode()
    upstream = html[html.index("Messages sent upstream"):html.index('id="cs-reply-heading"')]
    order = [upstream.index(text) for text in ("Be brief.", "first question", "first answer",
                                               "second question")]
    assert order == sorted(order)
    assert "second answer" in html[html.index('id="cs-reply-heading"'):]
    assert "&quot;call_1&quot;" in html and "&quot;lookup&quot;" in html  # pretty JSON
    for metadata in ("req-7", "host:42", "tool_calls", "120", "0.9"):
        assert metadata in html, metadata
    assert HIDDEN not in html


def test_detail_links_to_the_conversation_and_the_users_other_generations(
    admin_client: Any, alice: Any
) -> None:
    generation = make_generation(alice)
    html = admin_client.get(reverse("admin:chatstream_generation_change",
                                    args=[generation.pk])).content.decode()
    assert reverse("admin:chatstream_conversation_change",
                   args=[generation.conversation_id]) in html
    assert f"{reverse(CHANGELIST)}?user__id__exact={alice.pk}" in html
    other = admin_client.get(reverse(CHANGELIST), {"user__id__exact": alice.pk})
    assert listed(other) == {generation.pk}


def test_detail_without_content_permission_shows_metadata_only(
    admin_client_for: Callable[..., Any], alice: Any
) -> None:
    generation = _exchange(alice)
    client = admin_client_for(*METADATA)
    response = client.get(reverse("admin:chatstream_generation_change", args=[generation.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    for text in ("first question", "second question", "first answer", "second answer",
                 "call_1", "lookup"):
        assert text not in html, text
    assert html.count(HIDDEN) == 3  # upstream messages, reply, tool calls
    assert "req-7" in html and "host:42" in html


def test_detail_escapes_script_and_renders_markdown_safely(admin_client: Any,
                                                           alice: Any) -> None:
    generation = make_generation(
        alice, prompt="<script>alert('prompt')</script>",
        content="**bold** <script>alert('reply')</script> [x](javascript:alert(1))",
        tool_calls=[{"arguments": "<img src=x onerror=alert(1)>"}],
    )
    html = admin_client.get(reverse("admin:chatstream_generation_change",
                                    args=[generation.pk])).content.decode()
    assert "<strong>bold</strong>" in html
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(&#x27;prompt&#x27;)" in html
    assert "&lt;script&gt;alert('reply')" in html  # shown as text by the Markdown renderer
    assert 'href="javascript:' not in html
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html


def test_conversation_page_hides_text_without_content_permission(
    admin_client_for: Callable[..., Any], alice: Any
) -> None:
    generation = _exchange(alice)
    url = reverse("admin:chatstream_conversation_change", args=[generation.conversation_id])
    html = admin_client_for(*METADATA).get(url).content.decode()
    for text in ("first question", "first answer", "second answer"):
        assert text not in html, text
    assert HIDDEN in html
    assert str(generation.pk)[:8] in html  # the generations inline is there
    listing = admin_client_for(*METADATA).get(
        reverse("admin:chatstream_conversation_changelist")).content.decode()
    assert "first question" not in listing  # the title is the first message
    history = reverse("admin:chatstream_conversation_history",
                      args=[generation.conversation_id])
    assert admin_client_for(*METADATA).get(history).status_code == 403


def test_conversation_search_by_user_and_by_title_with_permission(
    admin_client_for: Callable[..., Any], alice: Any, bob: Any
) -> None:
    mine = make_generation(alice, prompt="Plans for the garden").conversation
    make_generation(bob, prompt="Something else")
    url = reverse("admin:chatstream_conversation_changelist")
    listed_ids = lambda response: {c.pk for c in response.context["cl"].result_list}  # noqa: E731
    client = admin_client_for(*METADATA)
    assert listed_ids(client.get(url, {"q": "alice@"})) == {mine.pk}
    assert listed_ids(client.get(url, {"q": "garden"})) == set()
    assert client.get(url, {"title__icontains": "garden"}).status_code == 400
    assert listed_ids(admin_client_for(*CONTENT).get(url, {"q": "garden"})) == {mine.pk}


def test_conversation_page_shows_text_with_content_permission(
    admin_client_for: Callable[..., Any], alice: Any
) -> None:
    generation = _exchange(alice)
    url = reverse("admin:chatstream_conversation_change", args=[generation.conversation_id])
    html = admin_client_for(*CONTENT).get(url).content.decode()
    for text in ("first question", "first answer", "second question", "second answer"):
        assert text in html, text
    assert HIDDEN not in html


def test_conversation_page_queries_do_not_grow_with_its_length(admin_client: Any,
                                                                alice: Any) -> None:
    def queries_for(exchanges: int) -> int:
        first = make_generation(alice)
        for _ in range(exchanges - 1):
            make_generation(alice, conversation=first.conversation)
        url = reverse("admin:chatstream_conversation_change", args=[first.conversation_id])
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(url).status_code == 200
        return len(captured)

    queries_for(1)  # warm caches
    assert queries_for(3) == queries_for(25)


# --- exports -------------------------------------------------------------------------------------


def _download(response: Any) -> str:
    assert isinstance(response, StreamingHttpResponse)
    return b"".join(response.streaming_content).decode()


def test_csv_export_streams_every_filtered_row_with_metadata_only(
    admin_client_for: Callable[..., Any], alice: Any
) -> None:
    for _ in range(3):
        make_generation(alice, status=Status.FAILED, content="private words",
                        error_type="http_error")
    make_generation(alice, status=Status.COMPLETED)
    client = admin_client_for(*METADATA)
    response = client.get(reverse("admin:chatstream_generation_export_csv"),
                          {"status__exact": "failed", "p": "3"})
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(_download(response))))
    assert len(rows) == 3 and {row["status"] for row in rows} == {"failed"}
    assert list(rows[0]) == [column.name for column in exports.metadata_columns()]
    assert rows[0]["username"] == "alice" and rows[0]["ttft_ms"] == "120"


def test_exports_carry_text_only_for_content_permission(admin_client_for: Callable[..., Any],
                                                        alice: Any) -> None:
    make_generation(alice, prompt="the question", content="the answer",
                    tool_calls=[{"id": "call_9"}])
    url = reverse("admin:chatstream_generation_export_jsonl")
    without = _download(admin_client_for(*METADATA).get(url))
    assert "the answer" not in without and "the question" not in without
    assert "call_9" not in without
    line = json.loads(_download(admin_client_for(*CONTENT).get(url)).splitlines()[0])
    assert line["prompt"] == "the question" and line["content"] == "the answer"
    assert line["tool_calls"] == [{"id": "call_9"}]
    assert line["status"] == "completed" and line["ttft_ms"] == 120


@pytest.mark.parametrize("name", ["export_csv", "export_jsonl"])
def test_an_export_with_a_filter_the_list_cannot_take_goes_back_to_the_list(
        admin_client: Any, alice: Any, name: str) -> None:
    make_generation(alice)
    response = admin_client.get(reverse(f"admin:chatstream_generation_{name}"),
                                {"created_at__gte": "not a date"})
    assert response.status_code == 302
    assert response["Location"] == reverse(CHANGELIST) + "?e=1"  # as the list itself answers
    assert admin_client.get(reverse(CHANGELIST),
                            {"created_at__gte": "not a date"})["Location"].endswith("?e=1")


def test_jsonl_export_has_one_object_per_generation(admin_client: Any, alice: Any) -> None:
    bulk_generations(alice, 450)  # more than one write batch
    response = admin_client.get(reverse("admin:chatstream_generation_export_jsonl"))
    assert response["Content-Type"].startswith("application/x-ndjson")
    lines = _download(response).splitlines()
    assert len(lines) == 450
    assert len({json.loads(line)["id"] for line in lines}) == 450


@pytest.mark.parametrize("payload", ["=HYPERLINK(\"http://x\")", "+1+1", "-2+3", "@SUM(A1)",
                                     "\tcmd"])
def test_csv_export_neutralises_formulas(admin_client: Any, alice: Any, payload: str) -> None:
    make_generation(alice, content=payload, request_id=payload)
    rows = list(csv.DictReader(io.StringIO(_download(
        admin_client.get(reverse("admin:chatstream_generation_export_csv"))))))
    assert rows[0]["content"] == "'" + payload
    assert rows[0]["request_id"] == "'" + payload


def test_export_follows_the_search(admin_client: Any, alice: Any, bob: Any) -> None:
    make_generation(alice)
    make_generation(bob)
    rows = list(csv.DictReader(io.StringIO(_download(
        admin_client.get(reverse("admin:chatstream_generation_export_csv"), {"q": "bob"})))))
    assert [row["username"] for row in rows] == ["bob"]


@pytest.fixture
def export_rows(transactional_db: Any) -> Any:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    alice = get_user_model().objects.create_user("alice", "alice@example.com", "pw")
    bulk_generations(alice, 30)
    return user


@pytest.mark.django_db(transaction=True)
async def test_export_under_asgi_streams_from_an_async_iterator(async_client: Any,
                                                                export_rows: Any) -> None:
    await async_client.aforce_login(export_rows)
    response = await async_client.get(reverse("admin:chatstream_generation_export_csv"))
    assert response.status_code == 200
    assert response.is_async  # no "must consume synchronous iterators" buffering
    body = b"".join([chunk async for chunk in response.streaming_content]).decode()
    assert len(body.strip().splitlines()) == 31
    # The rows were read on the async-to-sync thread; the test client keeps connections open.
    await sync_to_async(connections.close_all)()


# --- the summary ---------------------------------------------------------------------------------

NOW = datetime(2026, 3, 10, 15, 0, tzinfo=UTC)
ALIASES = ["default", *(["postgres"] if "postgres" in settings.DATABASES else [])]


@pytest.fixture(params=["default", pytest.param("postgres", marks=pytest.mark.postgres)],
                ids=["sqlite", "postgres"])
def history(request: Any, require_service: Callable[..., None]) -> Any:
    """Known generations over the days before NOW (2026-03-10, UTC), in SQLite or PostgreSQL.

    Returns the generations' queryset in that database.
    """
    alias = request.param
    if alias == "postgres":
        require_service("PostgreSQL (CHATSTREAM_TEST_POSTGRES)",
                        lambda: "postgres" in settings.DATABASES)
    users = get_user_model().objects.db_manager(alias)
    alice, bob = (users.create_user(name, f"{name}@example.com", "pw")
                  for name in ("alice", "bob"))
    make = partial(make_generation, using=alias)
    day = datetime(2026, 3, 8, 9, tzinfo=UTC)
    # Model "fast": TTFTs of 100..1000 ms on March 8; all completed, alice's tokens.
    for i in range(10):
        make(alice, created_at=day + timedelta(minutes=i), ttft_ms=100 * (i + 1),
             prompt_tokens=100, completion_tokens=50, cached_tokens=10)
    # Model "slow": 20 generations on March 9, TTFT 1..20 s; bob's tokens.
    for i in range(20):
        make(bob, model="slow", created_at=day + timedelta(days=1, minutes=i),
             ttft_ms=1000 * (i + 1), prompt_tokens=500, completion_tokens=500)
    # Failures on March 10, no first token.
    for error_type in ("http_error", "http_error", "stall"):
        make(bob, status=Status.FAILED, error_type=error_type, content="",
             created_at=NOW - timedelta(hours=1), ttft_ms=None, duration_ms=None)
    make(alice, status=Status.CANCELLED, error_type="stopped_by_user",
         created_at=NOW - timedelta(hours=2), ttft_ms=None)
    # Outside a 7-day period: counted in 30 days only.
    make(alice, created_at=NOW - timedelta(days=20), ttft_ms=99_000, error_type="stall",
         prompt_tokens=1, completion_tokens=1)
    return Generation.objects.using(alias)


summary_db = pytest.mark.django_db(databases=ALIASES)


@summary_db
def test_summary_counts_generations_per_day_and_status(history: Any) -> None:
    figures = summary.build(history, days=7, now=NOW)
    assert len(figures.per_day) == 7
    assert figures.per_day[0].day.isoformat() == "2026-03-04"
    by_day = {d.day.isoformat(): d.counts for d in figures.per_day}
    assert by_day["2026-03-08"] == {"completed": 10}
    assert by_day["2026-03-09"] == {"completed": 20}
    assert by_day["2026-03-10"] == {"failed": 3, "cancelled": 1}
    assert by_day["2026-03-07"] == {}
    assert figures.total == 34
    assert figures.status_totals["completed"] == 30


@summary_db
def test_summary_days_follow_the_current_time_zone(history: Any) -> None:
    # In Tokyo (UTC+9), 09:00-09:19 UTC on March 9 is 18:00-18:19 on March 9: unchanged; the
    # failures at 14:00 UTC on March 10 fall on March 10 at 23:00 local time.
    with timezone.override("Asia/Tokyo"):
        figures = summary.build(history, days=7, now=NOW)
    by_day = {d.day.isoformat(): d.counts for d in figures.per_day}
    assert by_day["2026-03-10"] == {"failed": 3, "cancelled": 1}
    with timezone.override("America/Los_Angeles"):  # UTC-7 since March 8 (DST)
        figures = summary.build(history, days=7, now=NOW)
    by_day = {d.day.isoformat(): d.counts for d in figures.per_day}
    assert by_day["2026-03-08"] == {"completed": 10}  # 02:00 local
    assert by_day["2026-03-10"] == {"failed": 3, "cancelled": 1}  # 06:00-07:00 local


@summary_db
def test_summary_ttft_percentiles_per_model(history: Any) -> None:
    figures = summary.build(history, days=7, now=NOW)
    latency = {row.model: (row.count, row.p50_ms, row.p95_ms) for row in figures.latency}
    # Nearest rank: p50 of 10 is the 5th value, p95 the 10th; of 20, the 10th and 19th.
    assert latency == {"fast": (10, 500, 1000), "slow": (20, 10_000, 19_000)}


@summary_db
def test_summary_top_users_and_error_types(history: Any) -> None:
    figures = summary.build(history, days=7, now=NOW)
    users = [(row["username"], row["generations"], row["total"], row["cached"])
             for row in figures.users]
    assert users == [("bob", 23, 20_000, 0), ("alice", 11, 1500, 100)]
    assert [(row["error_type"], row["n"]) for row in figures.errors] == [
        ("http_error", 2), ("stall", 1), ("stopped_by_user", 1)]
    assert figures.tokens == {"prompt": 11_000, "cached": 100, "completion": 10_500,
                              "total": 21_500}


@summary_db
def test_summary_period_widens_with_days(history: Any) -> None:
    figures = summary.build(history, days=30, now=NOW)
    assert figures.total == 35
    assert dict((row["error_type"], row["n"]) for row in figures.errors)["stall"] == 2
    assert {row.model: row.p95_ms for row in figures.latency}["fast"] == 99_000


def test_chart_scale_uses_round_steps() -> None:
    assert [chart.step_for(n) for n in (0, 3, 5, 6, 37, 100, 101, 2400)] == [
        1, 1, 1, 2, 10, 20, 50, 500]


def test_nearest_rank() -> None:
    assert [summary.nearest_rank(50, n) for n in (1, 2, 10, 11)] == [1, 1, 5, 6]
    assert [summary.nearest_rank(95, n) for n in (1, 20, 100, 101)] == [1, 19, 95, 96]


@summary_db
def test_chart_stacks_one_segment_per_day_and_status(history: Any) -> None:
    drawn = summary.build(history, days=7, now=NOW).chart
    assert drawn is not None
    assert len(drawn.rects) == 4  # Mar 8 completed, Mar 9 completed, Mar 10 failed + cancelled
    heights = {rect.label: float(rect.height) for rect in drawn.rects}
    assert heights["2026-03-09: 20 completed"] == pytest.approx(
        2 * heights["2026-03-08: 10 completed"])


def test_summary_page_renders_figures_and_escapes_labels(admin_client_for: Callable[..., Any],
                                                         alice: Any) -> None:
    make_generation(alice, status=Status.FAILED, content="", ttft_ms=None,
                    error_type="<img src=x onerror=alert(1)>")
    make_generation(alice, model="<b>m</b>", ttft_ms=300)
    client = admin_client_for("view_generation")
    response = client.get(reverse("admin:chatstream_generation_summary"), {"days": "7"})
    assert response.status_code == 200
    html = response.content.decode()
    content = html[html.index('id="content-main"'):]
    assert "<svg" in content and "<rect" in content and "<script" not in content
    assert response.context["summary"].days == 7
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<b>m</b>" not in html and "&lt;b&gt;m&lt;/b&gt;" in html
    assert ">300<" in html  # the single TTFT is both p50 and p95
    changelist = admin_client_for("view_generation").get(reverse(CHANGELIST)).content.decode()
    assert reverse("admin:chatstream_generation_summary") in changelist


@pytest.mark.parametrize(("value", "days"), [("7", 7), ("90", 90), ("13", 30), ("x", 30),
                                             (None, 30)])
def test_summary_period_parameter(value: str | None, days: int) -> None:
    assert summary.parse_days(value) == days


def test_summary_links_filter_the_list_to_the_period(admin_client: Any, alice: Any) -> None:
    inside = make_generation(alice, error_type="stall", status=Status.FAILED)
    make_generation(alice, error_type="stall", status=Status.FAILED,
                    created_at=timezone.now() - timedelta(days=60))
    response = admin_client.get(reverse("admin:chatstream_generation_summary"), {"days": "7"})
    url = response.context["summary"].errors[0]["url"]
    assert listed(admin_client.get(url)) == {inside.pk}


@pytest.mark.django_db(transaction=True)
async def test_under_asgi_an_export_reads_and_writes_in_batches_and_loses_no_row(
        async_client: Any, admin_user: Any) -> None:
    await sync_to_async(bulk_generations)(admin_user, 450)  # three writes: 200, 200 and 50
    await async_client.aforce_login(admin_user)
    response = await async_client.get(reverse("admin:chatstream_generation_export_csv"))
    assert response.status_code == 200 and response.is_async
    chunks = [chunk async for chunk in response.streaming_content]
    assert len(chunks) == 4  # the header, then the rows in batches
    rows = list(csv.DictReader(io.StringIO(b"".join(chunks).decode())))
    assert len(rows) == 450 and len({row["id"] for row in rows}) == 450


@pytest.mark.django_db(databases=ALIASES)
@pytest.mark.parametrize("alias", ALIASES)
def test_summary_totals_costs_per_day_model_and_user_in_their_currency(
        alias: str, require_service: Any) -> None:
    from decimal import Decimal

    if alias == "postgres":
        require_service("PostgreSQL (CHATSTREAM_TEST_POSTGRES)",
                        lambda: "postgres" in settings.DATABASES)
    users = get_user_model().objects.db_manager(alias)
    alice, bob = (users.create_user(name, f"{name}@example.com", "pw") for name in ("alice", "bob"))
    make = partial(make_generation, using=alias, currency="USD")
    day = datetime(2026, 3, 8, 9, tzinfo=UTC)
    make(alice, created_at=day, cost=Decimal("0.0012345678"))
    make(alice, created_at=day, cost=Decimal("1.5"), answered_by="backup")  # a fallback's
    make(bob, created_at=day + timedelta(days=1), cost=Decimal("2"), model="slow")
    make(bob, created_at=day + timedelta(days=1), cost=Decimal("3"), currency="EUR")
    make(bob, created_at=day + timedelta(days=1), cost=None, currency="")  # no price: none
    costs = summary.build(Generation.objects.using(alias), days=7, now=NOW).costs
    assert [(r["currency"], r["cost"], r["generations"]) for r in costs["total"]] == [
        ("EUR", Decimal(3), 1), ("USD", Decimal("3.5012345678"), 3)]
    assert [(r["day"].isoformat(), r["currency"], r["cost"]) for r in costs["days"]] == [
        ("2026-03-08", "USD", Decimal("1.5012345678")), ("2026-03-09", "EUR", Decimal(3)),
        ("2026-03-09", "USD", Decimal(2))]
    assert [(r["priced_by"], r["currency"], r["cost"]) for r in costs["models"]] == [
        ("backup", "USD", Decimal("1.5")), ("fast", "EUR", Decimal(3)),
        ("fast", "USD", Decimal("0.0012345678")), ("slow", "USD", Decimal(2))]
    assert [(r["username"], r["shown"]) for r in costs["users"]] == [
        ("bob", "3.00 EUR"), ("bob", "2.00 USD"), ("alice", "1.50 USD")]


def test_summary_page_and_exports_show_costs(admin_client: Any, alice: Any) -> None:
    from decimal import Decimal

    make_generation(alice, cost=Decimal("0.0042"), currency="USD")
    page = admin_client.get(reverse("admin:chatstream_generation_summary"), {"days": "7"})
    html = page.content.decode()
    assert 'id="cs-costs"' in html and "0.0042 USD" in html
    rows = list(csv.DictReader(io.StringIO(_download(
        admin_client.get(reverse("admin:chatstream_generation_export_csv"))))))
    assert rows[0]["cost"] == "0.0042000000" and rows[0]["currency"] == "USD"
    line = json.loads(_download(admin_client.get(
        reverse("admin:chatstream_generation_export_jsonl"))).splitlines()[0])
    assert line["cost"] == "0.0042000000" and line["currency"] == "USD"

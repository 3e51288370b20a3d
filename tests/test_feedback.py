"""Feedback on replies: the thumbs and comment on the page, and what staff see of them (the
generation list's column and filter, the detail page, the summary and the exports)."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.http import StreamingHttpResponse
from django.template.loader import render_to_string
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from chatstream.admin import summary
from chatstream.models import Conversation, Feedback, Generation, Message
from chatstream.models.feedback import COMMENT_LENGTH

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
GOOD, BAD = Feedback.Rating.GOOD, Feedback.Rating.BAD
HIDDEN = "hidden: you lack the permission"
CHANGELIST = "admin:chatstream_generation_changelist"


@pytest.fixture
def alice() -> Any:
    return get_user_model().objects.create_user("alice", "alice@example.com", "pw")


@pytest.fixture
def client(alice: Any) -> Client:
    client = Client()
    client.force_login(alice)
    return client


def reply(user: Any, *, conversation: Conversation | None = None, model: str = "fast",
          status: str = Generation.Status.COMPLETED, **fields: Any) -> Generation:
    """One exchange: a question and its reply."""
    if conversation is None:
        conversation = Conversation.objects.create(user=user, model=model)
    prompt = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                    content="What is SSE?")
    return Generation.objects.create(conversation=conversation, user=user,
                                     prompt_message=prompt, model=model, status=status,
                                     content="A stream of events.", **fields)


def url(generation: Generation) -> str:
    return reverse("chatstream:generation-feedback", kwargs={"pk": generation.pk})


def pressed(html: str) -> dict[str, bool]:
    """Which thumbs the controls show pressed."""
    found = re.findall(r'id="feedback-[0-9a-f-]+-(good|bad)"[^>]*aria-pressed="(true|false)"',
                       html)
    return {name: state == "true" for name, state in found}


def stored(generation: Generation) -> tuple[int, str] | None:
    row = Feedback.objects.filter(generation=generation).values_list("rating", "comment")
    return row.first()


# --- the page ------------------------------------------------------------------------------------


def test_a_finished_reply_offers_two_toggle_thumbs_with_names(client: Client, alice: Any
                                                              ) -> None:
    generation = reply(alice)
    html = client.get(generation.conversation.get_absolute_url()).content.decode()
    controls = html[html.index(f'id="feedback-{generation.pk}"'):]
    controls = controls[:controls.index("</div>")]
    assert pressed(controls) == {"good": False, "bad": False}
    assert ">Good reply<" in controls and ">Bad reply<" in controls
    assert f'action="{url(generation)}"' in controls and "csrfmiddlewaretoken" in controls
    assert "<details" not in controls  # the comment comes once the reply is rated


def test_a_live_reply_has_no_thumbs(client: Client, alice: Any) -> None:
    generation = reply(alice, status=Generation.Status.STREAMING)
    html = client.get(generation.conversation.get_absolute_url()).content.decode()
    assert f'id="generation-{generation.pk}"' in html
    assert f'id="feedback-{generation.pk}"' not in html


def test_thumb_up_then_down_then_a_comment_then_up_again_keeps_the_comment(
    client: Client, alice: Any
) -> None:
    generation = reply(alice)
    response = client.post(url(generation), {"rating": "good"}, **HTMX)
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith(f'<div class="cs-feedback" id="feedback-{generation.pk}"')
    assert pressed(html) == {"good": True, "bad": False}
    # The pressed thumb now takes the rating back; the other one changes it.
    assert re.search(r'id="feedback-[^"]+-good" name="rating" value=""', html)
    assert re.search(r'id="feedback-[^"]+-bad" name="rating" value="bad"', html)
    assert "<details" in html and "Add a comment" in html and "saved" in html
    assert stored(generation) == (GOOD, "")

    html = client.post(url(generation), {"rating": "bad"}, **HTMX).content.decode()
    assert pressed(html) == {"good": False, "bad": True}
    assert stored(generation) == (BAD, "")

    html = client.post(url(generation), {"rating": "bad", "comment": "  Too vague.  "},
                       **HTMX).content.decode()
    assert stored(generation) == (BAD, "Too vague.")
    assert ">Too vague.</textarea>" in html and "<details class=\"cs-feedback-more\" open" in html

    client.post(url(generation), {"rating": "good"}, **HTMX)
    assert stored(generation) == (GOOD, "Too vague.")
    assert Feedback.objects.get().user == alice


def test_pressing_the_pressed_thumb_takes_the_rating_and_comment_back(client: Client,
                                                                     alice: Any) -> None:
    generation = reply(alice)
    Feedback.objects.create(generation=generation, user=alice, rating=GOOD, comment="Nice")
    html = client.post(url(generation), {"rating": ""}, **HTMX).content.decode()
    assert stored(generation) is None
    assert pressed(html) == {"good": False, "bad": False}
    assert "<details" not in html and "taken back" in html


def test_an_empty_comment_removes_the_comment_and_keeps_the_rating(client: Client,
                                                                  alice: Any) -> None:
    generation = reply(alice)
    Feedback.objects.create(generation=generation, user=alice, rating=BAD, comment="Wrong")
    client.post(url(generation), {"rating": "bad", "comment": ""}, **HTMX)
    assert stored(generation) == (BAD, "")


def test_a_comment_too_long_is_refused_with_a_clear_error_and_kept_to_shorten(
    client: Client, alice: Any
) -> None:
    generation = reply(alice)
    Feedback.objects.create(generation=generation, user=alice, rating=GOOD, comment="Short")
    text = "x" * (COMMENT_LENGTH + 1)
    response = client.post(url(generation), {"rating": "good", "comment": text}, **HTMX)
    assert response.status_code == 400
    html = response.content.decode()
    assert f"at most {COMMENT_LENGTH} characters long (this one has {COMMENT_LENGTH + 1})" in html
    assert 'role="alert"' in html and 'aria-invalid="true"' in html
    assert f">{text}</textarea>" in html  # what they wrote, to shorten
    assert f'maxlength="{COMMENT_LENGTH}"' in html
    assert stored(generation) == (GOOD, "Short")


def test_a_rating_that_is_neither_good_nor_bad_is_refused(client: Client, alice: Any) -> None:
    generation = reply(alice)
    response = client.post(url(generation), {"rating": "meh"}, **HTMX)
    assert response.status_code == 400
    assert stored(generation) is None


def test_without_javascript_a_rating_comes_back_to_the_exchange(client: Client,
                                                                alice: Any) -> None:
    generation = reply(alice)
    response = client.post(url(generation), {"rating": "bad"})
    assert response.status_code == 302
    assert response["Location"] == (f"{generation.conversation.get_absolute_url()}"
                                    f"#exchange-{generation.prompt_message_id}")
    page = client.get(response["Location"]).content.decode()
    assert pressed(page) == {"good": False, "bad": True}
    assert "Thank you: your rating was saved." in page  # the page's flash message


def test_without_javascript_a_comment_too_long_says_why_on_the_page(client: Client,
                                                                    alice: Any) -> None:
    generation = reply(alice)
    response = client.post(url(generation), {"rating": "good", "comment": "x" * 3000},
                           follow=True)
    assert "at most 2000 characters long" in response.content.decode()
    assert stored(generation) is None


def test_a_reply_still_being_written_cannot_be_rated(client: Client, alice: Any) -> None:
    generation = reply(alice, status=Generation.Status.STREAMING)
    response = client.post(url(generation), {"rating": "good"}, **HTMX)
    assert response.status_code == 409
    assert "still being written" in response.content.decode()
    assert stored(generation) is None


def test_another_users_reply_is_not_found(alice: Any) -> None:
    generation = reply(alice)
    mallory = Client()
    mallory.force_login(get_user_model().objects.create_user("mallory"))
    assert mallory.post(url(generation), {"rating": "bad"}, **HTMX).status_code == 404
    assert stored(generation) is None


def test_rating_needs_a_post_a_login_a_csrf_token_and_chat_access(
    client: Client, alice: Any, settings: Any
) -> None:
    generation = reply(alice)
    assert client.get(url(generation)).status_code == 405
    anonymous = Client().post(url(generation), {"rating": "good"})
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    assert strict.post(url(generation), {"rating": "good"}).status_code == 403
    settings.CHATSTREAM_ACCESS = "tests.hostapp.access.chat_access"
    alice.groups.create(name="banned")
    assert client.post(url(generation), {"rating": "good"}).status_code == 403
    assert stored(generation) is None


def test_the_page_reads_every_replys_feedback_without_a_query_per_reply(
    client: Client, alice: Any, django_assert_num_queries: Any
) -> None:
    def conversation_with(replies: int) -> str:
        conversation = Conversation.objects.create(user=alice, model="fast")
        for i in range(replies):
            generation = reply(alice, conversation=conversation)
            Feedback.objects.create(generation=generation, user=alice,
                                    rating=GOOD if i % 2 else BAD, comment=f"note {i}")
        return conversation.get_absolute_url()

    few, many = conversation_with(2), conversation_with(12)
    for url in (few, many):  # warm caches (session, content types), keep the replies' HTML
        client.get(url)
    with CaptureQueriesContext(connection) as queries:
        client.get(few)
    with django_assert_num_queries(len(queries)):
        html = client.get(many).content.decode()
    assert len(re.findall(r'-good"[^>]*aria-pressed="true"', html)) == 6
    assert len(re.findall(r'-bad"[^>]*aria-pressed="true"', html)) == 6
    assert ">note 11</textarea>" in html


def test_a_reply_that_just_ended_renders_its_thumbs_without_a_query(
    alice: Any, django_assert_num_queries: Any
) -> None:
    # As the stream's `done` event renders it, possibly with no database at hand.
    generation = Generation.objects.get(pk=reply(alice).pk)
    with django_assert_num_queries(0):
        html = render_to_string("chatstream/includes/feedback.html", {"generation": generation})
    assert pressed(html) == {"good": False, "bad": False}


# --- the admin -----------------------------------------------------------------------------------

METADATA = ("view_generation", "view_conversation", "view_message", "view_feedback")
CONTENT = (*METADATA, "view_generation_content")


@pytest.fixture
def staff_client(client: Client) -> Callable[..., Client]:
    made = iter(range(1000))

    def login(*codenames: str) -> Client:
        user = get_user_model().objects.create_user(f"reviewer{next(made)}", is_staff=True)
        user.user_permissions.set(Permission.objects.filter(
            content_type__app_label="chatstream", codename__in=codenames))
        staff = Client()
        staff.force_login(user)
        return staff

    return login


@pytest.fixture
def rated(alice: Any) -> dict[str, Generation]:
    """Replies rated good, bad (with a comment), and not at all; one of bob's rated by alice
    (not his own rating: it does not count)."""
    good, bad, unrated = reply(alice), reply(alice, model="slow"), reply(alice)
    Feedback.objects.create(generation=good, user=alice, rating=GOOD)
    Feedback.objects.create(generation=bad, user=alice, rating=BAD, comment="=HYPERLINK(1)")
    bob = get_user_model().objects.create_user("bob")
    others = reply(bob)
    Feedback.objects.create(generation=others, user=alice, rating=GOOD)
    return {"good": good, "bad": bad, "unrated": unrated, "others": others}


def listed(response: Any) -> set[Any]:
    return {generation.pk for generation in response.context["cl"].result_list}


@pytest.mark.parametrize(("value", "expected"), [("good", {"good"}), ("bad", {"bad"}),
                                                 ("none", {"unrated", "others"})])
def test_the_generation_list_filters_by_feedback(admin_client: Any, rated: dict[str, Any],
                                                 value: str, expected: set[str]) -> None:
    response = admin_client.get(reverse(CHANGELIST), {"rating": value})
    assert response.status_code == 200
    assert listed(response) == {rated[name].pk for name in expected}
    assert "?rating=bad" in response.content.decode()


def test_the_generation_list_shows_the_rating_in_a_column(admin_client: Any,
                                                         rated: dict[str, Any]) -> None:
    html = admin_client.get(reverse(CHANGELIST), {"o": "15"}).content.decode()
    assert ">Feedback<" in html.replace("</a>", "<")
    rows = {pk: html[html.index(f"/{pk}/change/"):][:3000] for pk in
            (rated["good"].pk, rated["bad"].pk)}
    assert 'class="field-feedback">good<' in rows[rated["good"].pk]
    assert 'class="field-feedback">bad<' in rows[rated["bad"].pk]


def test_comment_lookups_in_the_url_are_refused(staff_client: Callable[..., Client],
                                                rated: dict[str, Any]) -> None:
    response = staff_client(*METADATA).get(reverse(CHANGELIST),
                                           {"feedback__comment__icontains": "HYPER"})
    assert response.status_code == 400


def test_the_detail_page_shows_the_comment_only_with_the_content_permission(
    staff_client: Callable[..., Client], rated: dict[str, Any]
) -> None:
    page = reverse("admin:chatstream_generation_change", args=[rated["bad"].pk])
    without = staff_client(*METADATA).get(page).content.decode()
    assert "bad (last changed" in without
    assert "HYPERLINK" not in without
    feedback = without[without.index(">Feedback</h2>"):]
    assert HIDDEN in feedback
    with_content = staff_client(*CONTENT).get(page).content.decode()
    assert "=HYPERLINK(1)" in with_content[with_content.index(">Feedback</h2>"):]
    unrated = reverse("admin:chatstream_generation_change", args=[rated["unrated"].pk])
    assert "not rated" in staff_client(*METADATA).get(unrated).content.decode()


def test_the_feedback_list_shows_comments_only_with_the_content_permission(
    staff_client: Callable[..., Client], rated: dict[str, Any]
) -> None:
    page = reverse("admin:chatstream_feedback_changelist")
    without = staff_client(*METADATA).get(page)
    assert without.status_code == 200 and len(without.context["cl"].result_list) == 3
    assert "HYPERLINK" not in without.content.decode()
    assert "=HYPERLINK(1)" in staff_client(*CONTENT).get(page).content.decode()
    assert staff_client(*METADATA).get(page, {"comment__icontains": "HYPER"}).status_code == 400


ALIASES = ["default", *(["postgres"] if "postgres" in settings.DATABASES else [])]


@pytest.mark.django_db(databases=ALIASES)
@pytest.mark.parametrize("alias", ["default", pytest.param("postgres", marks=pytest.mark.postgres)],
                         ids=["sqlite", "postgres"])
def test_the_summary_counts_good_and_bad_per_model_in_the_period(
    alias: str, require_service: Callable[..., None]
) -> None:
    if alias == "postgres":
        require_service("PostgreSQL (CHATSTREAM_TEST_POSTGRES)",
                        lambda: "postgres" in settings.DATABASES)
    alice = get_user_model().objects.db_manager(alias).create_user("alice")
    conversation = Conversation.objects.using(alias).create(user=alice, model="fast")
    now = timezone.now()

    def rated(model: str, rating: int | None, **fields: Any) -> None:
        prompt = Message.objects.using(alias).create(conversation=conversation, content="?",
                                                     role=Message.Role.USER)
        generation = Generation.objects.using(alias).create(
            conversation=conversation, user=alice, prompt_message=prompt, model=model,
            status=Generation.Status.COMPLETED, **fields)
        if rating is not None:
            Feedback.objects.using(alias).create(generation=generation, user=alice,
                                                 rating=rating)

    for model, given in {"fast": [GOOD, GOOD, GOOD, BAD, None], "slow": [BAD, None]}.items():
        for rating in given:
            rated(model, rating, created_at=now)
    rated("fast", BAD, created_at=now - timedelta(days=60))  # outside every period
    figures = summary.build(Generation.objects.using(alias), days=7, now=now)
    rows = {row.model: row for row in figures.feedback}
    assert (rows["fast"].generations, rows["fast"].good, rows["fast"].bad) == (5, 3, 1)
    assert rows["fast"].good_percent == 75 and rows["fast"].rated_percent == 80
    assert (rows["slow"].good, rows["slow"].bad, rows["slow"].good_percent) == (0, 1, 0)
    total = figures.feedback_total
    assert total is not None and (total.generations, total.good, total.bad) == (7, 3, 2)


def test_the_summary_page_shows_feedback_and_links_to_those_replies(
    admin_client: Any, rated: dict[str, Any]
) -> None:
    response = admin_client.get(reverse("admin:chatstream_generation_summary"), {"days": "7"})
    html = response.content.decode()
    section = html[html.index('id="cs-feedback"'):]
    section = section[:section.index('id="cs-users"')]
    assert "Feedback by model" in section and "All models" in section
    total = response.context["summary"].feedback_total
    assert (total.good, total.bad) == (1, 1)  # alice's rating of bob's reply is not counted
    assert listed(admin_client.get(total.urls["bad"])) == {rated["bad"].pk}
    assert ">100%<" in section  # fast: the one rated reply was rated good


def _download(response: Any) -> str:
    assert isinstance(response, StreamingHttpResponse)
    return b"".join(response.streaming_content).decode()  # type: ignore[arg-type]


def test_the_csv_export_has_the_rating_and_reasoning_tokens_never_the_comment_without_permission(
    staff_client: Callable[..., Client], rated: dict[str, Any]
) -> None:
    Generation.objects.filter(pk=rated["good"].pk).update(reasoning_tokens=321)
    export = reverse("admin:chatstream_generation_export_csv")
    rows = {row["id"]: row for row in csv.DictReader(io.StringIO(
        _download(staff_client(*METADATA).get(export))))}
    header = list(next(iter(rows.values())))
    assert header.index("reasoning_tokens") == header.index("completion_tokens") + 1
    assert "feedback_comment" not in header
    assert rows[str(rated["good"].pk)]["feedback"] == "good"
    assert rows[str(rated["good"].pk)]["reasoning_tokens"] == "321"
    assert rows[str(rated["bad"].pk)]["feedback"] == "bad"
    assert rows[str(rated["unrated"].pk)]["feedback"] == ""
    assert rows[str(rated["others"].pk)]["feedback"] == ""
    with_content = {row["id"]: row for row in csv.DictReader(io.StringIO(
        _download(staff_client(*CONTENT).get(export))))}
    assert with_content[str(rated["bad"].pk)]["feedback_comment"] == "'=HYPERLINK(1)"


def test_the_jsonl_export_follows_the_feedback_filter(staff_client: Callable[..., Client],
                                                      rated: dict[str, Any]) -> None:
    export = reverse("admin:chatstream_generation_export_jsonl")
    lines = _download(staff_client(*CONTENT).get(export, {"rating": "bad"})).splitlines()
    assert [json.loads(line)["id"] for line in lines] == [str(rated["bad"].pk)]
    line = json.loads(lines[0])
    assert (line["feedback"], line["feedback_comment"]) == ("bad", "=HYPERLINK(1)")


# --- the JSON API --------------------------------------------------------------------------------


def api_url(generation: Generation) -> str:
    return reverse("chatstream:api-generation-feedback", args=[generation.pk])


def api_post(client: Client, generation: Generation, body: dict[str, Any]) -> Any:
    return client.post(api_url(generation), body, content_type="application/json")


def test_the_api_rates_changes_comments_and_takes_back(client: Client, alice: Any) -> None:
    generation = reply(alice)
    assert client.get(api_url(generation)).json() == {
        "generation": str(generation.pk), "rating": None, "comment": "", "updated_at": None}
    answer = api_post(client, generation, {"rating": "good", "comment": " Clear. "})
    assert answer.status_code == 200
    assert (answer.json()["rating"], answer.json()["comment"]) == ("good", "Clear.")
    assert answer.json()["updated_at"]
    assert api_post(client, generation, {"rating": "bad"}).json()["comment"] == "Clear."
    assert stored(generation) == (BAD, "Clear.")
    assert client.get(api_url(generation)).json()["rating"] == "bad"
    assert api_post(client, generation, {"rating": None}).json()["rating"] is None
    assert stored(generation) is None


@pytest.mark.parametrize(("body", "says"), [
    ({}, 'rating must be "good", "bad" or null.'),
    ({"rating": "meh"}, 'rating must be "good", "bad" or null.'),
    ({"rating": 1}, 'rating must be "good", "bad" or null.'),
    ({"rating": "good", "comment": 5}, "comment must be a string."),
    ({"rating": "good", "comment": "x" * 2001}, "at most 2000 characters long"),
], ids=["missing", "unknown", "a-number", "comment-not-text", "comment-too-long"])
def test_the_api_refuses_a_bad_rating_or_comment(client: Client, alice: Any,
                                                 body: dict[str, Any], says: str) -> None:
    generation = reply(alice)
    answer = api_post(client, generation, body)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid"
    assert says in answer.json()["error"]["message"]
    assert stored(generation) is None


def test_the_api_refuses_to_rate_a_live_reply(client: Client, alice: Any) -> None:
    generation = reply(alice, status=Generation.Status.PENDING)
    answer = api_post(client, generation, {"rating": "good"})
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "still_live"
    assert stored(generation) is None

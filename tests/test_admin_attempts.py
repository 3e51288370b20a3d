"""The admin's view of attempts and fallbacks: a generation's upstream calls on its page, the
list filtered by whether a fallback answered, and the model cooldowns staff may end early."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from chatstream.models import Attempt, Cooldown, Generation
from tests.test_admin import make_generation

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:chatstream_generation_changelist"
COOLDOWNS = "admin:chatstream_cooldown_changelist"
METADATA = ("view_generation", "view_conversation", "view_message")


@pytest.fixture
def alice() -> Any:
    return get_user_model().objects.create_user("alice", "alice@example.com", "pw")


@pytest.fixture
def login(client: Any) -> Callable[..., Any]:
    """The test client signed in as a staff member holding exactly ``codenames``."""
    made = iter(range(1000))

    def as_staff(*codenames: str) -> Any:
        user = get_user_model().objects.create_user(f"reviewer{next(made)}", password="pw",
                                                    is_staff=True)
        user.user_permissions.set(Permission.objects.filter(
            content_type__app_label="chatstream", codename__in=codenames))
        client.force_login(user)
        return client

    return as_staff


def fell_back(user: Any) -> Generation:
    """A reply the model asked for failed to give: a 429 with Retry-After, a retry refused
    again, then the fallback answered."""
    generation = make_generation(user, model="fast", answered_by="spare",
                                 fallbacks=["spare", "last"])
    start = generation.started_at
    assert start is not None
    Attempt.objects.create(generation=generation, number=1, model="fast", status="failed",
                           http_status=429, error_type="rate_limited", retry_after=2.5,
                           started_at=start, finished_at=start + timedelta(milliseconds=40))
    Attempt.objects.create(generation=generation, number=2, model="fast", status="failed",
                           http_status=503, error_type="http_error",
                           started_at=start + timedelta(seconds=3),
                           finished_at=start + timedelta(seconds=3, milliseconds=20))
    Attempt.objects.create(generation=generation, number=3, model="spare", status="succeeded",
                           http_status=200, request_id="req-spare",
                           started_at=start + timedelta(seconds=4),
                           first_token_at=start + timedelta(seconds=4, milliseconds=310),
                           finished_at=start + timedelta(seconds=6))
    return generation


def inline_rows(html: str) -> list[list[str]]:
    """The attempts inline's rows, each a list of its cells' text."""
    group = html[html.index('id="attempts-group"'):]
    group = group[:group.index("</table>")]
    rows = re.findall(r'<tr class="form-row has_original".*?</tr>', group, re.S)
    return [[re.sub(r"<[^>]+>", "", cell).strip()
             for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows]


def test_a_generations_page_lists_its_attempts_in_order(login: Callable[..., Any],
                                                        alice: Any) -> None:
    generation = fell_back(alice)
    html = login(*METADATA).get(
        reverse("admin:chatstream_generation_change", args=[generation.pk])).content.decode()
    headers = re.findall(r'<th class="column-(\w+)"',
                         html[html.index('id="attempts-group"'):])[:9]
    assert headers == ["number", "model", "status", "http_status", "error_type",
                       "retry_after_s", "started", "ttft_ms", "finished"]
    rows = inline_rows(html)
    assert [row[:6] for row in rows] == [
        ["1", "fast", "failed", "429", "rate_limited", "2.5"],
        ["2", "fast", "failed", "503", "http_error", "-"],
        ["3", "spare", "succeeded", "200", "-", "-"],
    ]
    assert [row[7] for row in rows] == ["-", "-", "310"]  # only the one that answered has one
    started = timezone.localtime(generation.started_at).isoformat(sep=" ",
                                                                  timespec="milliseconds")
    assert rows[0][6] == started
    # Read-only: no input of the inline's rows, nothing to add.
    assert 'name="attempts-0-model"' not in html
    assert 'name="attempts-MAX_NUM_FORMS" value="0"' in html


def test_a_generations_page_says_who_answered_and_its_fallbacks(login: Callable[..., Any],
                                                                alice: Any) -> None:
    generation = fell_back(alice)
    html = login(*METADATA).get(
        reverse("admin:chatstream_generation_change", args=[generation.pk])).content.decode()
    answered = re.search(r'<div class="readonly">([^<]*)</div>', html[html.index(
        "field-answered_by"):])
    assert answered is not None and answered.group(1) == "spare"
    assert "field-fallbacks" in html and "[&quot;spare&quot;, &quot;last&quot;]" in html


def test_attempts_cost_one_query_however_many(login: Callable[..., Any], alice: Any) -> None:
    few, many = fell_back(alice), fell_back(alice)
    start = many.started_at
    Attempt.objects.bulk_create(
        Attempt(generation=many, number=n, model="fast", status="failed", started_at=start)
        for n in range(4, 12))
    client = login(*METADATA)
    counts = []
    for generation in (few, many):
        with CaptureQueriesContext(connection) as queries:
            response = client.get(reverse("admin:chatstream_generation_change",
                                          args=[generation.pk]))
        assert response.status_code == 200
        counts.append(len(queries))
    assert len(inline_rows(response.content.decode())) == 11
    assert counts[0] == counts[1]


def test_staff_who_may_not_view_generations_see_no_attempt(login: Callable[..., Any],
                                                          alice: Any) -> None:
    generation = fell_back(alice)
    client = login("view_conversation", "view_attempt")
    url = reverse("admin:chatstream_generation_change", args=[generation.pk])
    assert client.get(url).status_code == 403


@pytest.mark.parametrize(("query", "expected"), [
    ({"fell_back": "yes"}, {"fell_back"}),
    ({"fell_back": "no"}, {"itself", "no_call"}),
    ({"answered_by": "spare"}, {"fell_back"}),
    ({"answered_by": "fast"}, {"itself"}),
])
def test_the_list_filters_on_who_answered(login: Callable[..., Any], alice: Any,
                                          query: dict[str, str], expected: set[str]) -> None:
    rows = {"fell_back": fell_back(alice),
            "itself": make_generation(alice, model="fast", answered_by="fast"),
            "no_call": make_generation(alice, model="fast", status=Generation.Status.FAILED,
                                       content="")}
    client = login(*METADATA)
    response = client.get(reverse(CHANGELIST), query)
    assert response.status_code == 200
    assert {g.pk for g in response.context["cl"].result_list} == {
        rows[name].pk for name in expected}
    html = client.get(reverse(CHANGELIST)).content.decode()
    assert "By fell back" in html and "By answered by" in html
    assert "?answered_by=spare" in html  # a value in use is offered


# --- cooldowns -----------------------------------------------------------------------------------


def cooldowns() -> tuple[Cooldown, Cooldown]:
    now = timezone.now()
    return (Cooldown.objects.create(model="fast", until=now + timedelta(minutes=5),
                                    error_type="rate_limited"),
            Cooldown.objects.create(model="gone", until=now - timedelta(minutes=1),
                                    error_type="http_error"))


def test_cooldowns_are_listed_with_their_end_reason_and_whether_they_still_run(
    login: Callable[..., Any], settings: Any
) -> None:
    settings.CHATSTREAM_MODELS = {
        "fast": {"PROVIDER": "default", "MODEL": "fast", "LABEL": "<b>Fast</b> & co"}}
    running, _ended = cooldowns()
    response = login("view_cooldown").get(reverse(COOLDOWNS))
    assert response.status_code == 200
    html = response.content.decode()
    rows = re.findall(r"<tr>.*?</tr>", html[html.index("<tbody>"):], re.S)
    assert len(rows) == 2
    first, second = rows  # the latest end first
    assert "fast" in first and "&lt;b&gt;Fast&lt;/b&gt; &amp; co" in first
    assert "<b>Fast</b>" not in html
    assert "rate_limited" in first and 'alt="True"' in first
    assert "gone" in second and "http_error" in second and 'alt="False"' in second
    until = timezone.localtime(running.until).isoformat(sep=" ", timespec="milliseconds")
    assert until in first
    still = login("view_cooldown").get(reverse(COOLDOWNS), {"running": "yes"})
    assert [c.pk for c in still.context["cl"].result_list] == ["fast"]
    over = login("view_cooldown").get(reverse(COOLDOWNS), {"running": "no"})
    assert [c.pk for c in over.context["cl"].result_list] == ["gone"]


def test_a_cooldown_is_never_added_or_changed_here(login: Callable[..., Any]) -> None:
    running, _ended = cooldowns()
    client = login("view_cooldown", "add_cooldown", "change_cooldown", "delete_cooldown")
    assert client.get(reverse("admin:chatstream_cooldown_add")).status_code == 403
    change = reverse("admin:chatstream_cooldown_change", args=["fast"])
    client.post(change, {"model": "fast", "until": "2000-01-01 00:00:00", "error_type": "x"})
    running.refresh_from_db()
    assert running.error_type == "rate_limited" and running.until > timezone.now()


def test_staff_who_may_delete_a_cooldown_end_it_early(login: Callable[..., Any]) -> None:
    cooldowns()
    delete = reverse("admin:chatstream_cooldown_delete", args=["fast"])
    viewer = login("view_cooldown")
    assert viewer.post(delete, {"post": "yes"}).status_code == 403
    assert Cooldown.objects.filter(pk="fast").exists()
    page = login("view_cooldown", "delete_cooldown").get(
        reverse("admin:chatstream_cooldown_change", args=["fast"])).content.decode()
    assert delete in page  # the page offers it
    response = login("view_cooldown", "delete_cooldown").post(delete, {"post": "yes"})
    assert response.status_code == 302
    assert list(Cooldown.objects.values_list("pk", flat=True)) == ["gone"]

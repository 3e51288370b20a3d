"""What a long conversation costs: the context budget sent upstream (and stored), the page window
that shows it, and the per-conversation limit on messages."""

from __future__ import annotations

import json
import random
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from chatstream.domain.history import build_history
from chatstream.models import Conversation, Generation, Message
from chatstream.quota import estimate_prompt

from .conftest import read_events

HTMX = {"HTTP_HX_REQUEST": "true"}
Turn = list[dict[str, str]]


@pytest.fixture
def alice(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("alice", password="pw")


@pytest.fixture
def client(alice: Any) -> Client:
    client = Client()
    client.force_login(alice)
    return client


def url(name: str, pk: Any) -> str:
    return reverse(f"chatstream:{name}", kwargs={"pk": pk})


def conversation_with(user: Any, questions: list[str], replies: list[str | None], *,
                      model: str = "fast") -> tuple[Conversation, list[Turn], list[Message]]:
    """A conversation of earlier turns, written in three statements: each question, with its
    reply when one is given (None: the reply failed without text). Returns the conversation,
    the turns as sent upstream, and the questions' messages."""
    conversation = Conversation.objects.create(user=user, model=model)
    start = timezone.now() - timedelta(days=1)
    prompts = Message.objects.bulk_create([
        Message(conversation=conversation, role=Message.Role.USER, content=question,
                created_at=start + timedelta(seconds=2 * i))
        for i, question in enumerate(questions)
    ])
    generations = Generation.objects.bulk_create([
        Generation(conversation=conversation, user=user, prompt_message=prompt, model=model,
                   status="completed" if reply else "failed", content=reply or "",
                   created_at=prompt.created_at)
        for prompt, reply in zip(prompts, replies, strict=True)
    ])
    Message.objects.bulk_create([
        Message(conversation=conversation, role=Message.Role.ASSISTANT, content=reply,
                generation=generation, created_at=generation.created_at + timedelta(seconds=1))
        for generation, reply in zip(generations, replies, strict=True) if reply
    ])
    turns = [[{"role": "user", "content": question},
              *([{"role": "assistant", "content": reply}] if reply else [])]
             for question, reply in zip(questions, replies, strict=True)]
    return conversation, turns, prompts


def long_conversation(user: Any, count: int, size: int, **kwargs: Any
                      ) -> tuple[Conversation, list[Turn], list[Message]]:
    questions = [f"Question {i} " + "q" * size for i in range(count)]
    replies: list[str | None] = [f"Answer {i} " + "a" * size for i in range(count)]
    return conversation_with(user, questions, replies, **kwargs)


def new_generation(conversation: Conversation, content: str = "The new question",
                   model: str | None = None) -> Generation:
    """A new question and its (unsaved) generation, as the message view makes them."""
    prompt = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                    content=content)
    return Generation(conversation=conversation, user=conversation.user, prompt_message=prompt,
                      model=model or conversation.model)


def assert_newest_whole_turns_that_fit(sent: list[dict[str, str]], turns: list[Turn], *,
                                       system: list[dict[str, str]], new: str, budget: int
                                       ) -> int:
    """``sent`` is the system prompt, the newest whole turns that fit ``budget``, the new
    message; returns how many turns it holds."""
    assert sent[:len(system)] == system
    assert sent[-1] == {"role": "user", "content": new}
    middle = sent[len(system):-1]
    kept = 0
    while kept < len(turns) and sum(len(t) for t in turns[len(turns) - kept:]) < len(middle):
        kept += 1
    assert middle == [m for turn in turns[len(turns) - kept:] for m in turn], "not whole turns"
    fixed = [*system, sent[-1]]
    if kept:
        assert estimate_prompt(sent) <= budget
    if kept < len(turns):  # the next older turn did not fit
        assert estimate_prompt([*fixed, *turns[-kept - 1], *middle]) > budget
    return kept


# --- the context budget ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_long_conversation_sends_only_the_newest_turns_that_fit(alice, client, settings):
    settings.CHATSTREAM_SYSTEM_PROMPT = "Be brief."
    settings.CHATSTREAM_CONTEXT_TOKENS = 2000
    conversation, turns, _prompts = long_conversation(alice, 300, 400)

    response = client.post(url("message-create", conversation.pk), {"content": "And now?"},
                           **HTMX)

    assert response.status_code == 200
    sent = Generation.objects.get(prompt_message__content="And now?").upstream_messages
    kept = assert_newest_whole_turns_that_fit(
        sent, turns, system=[{"role": "system", "content": "Be brief."}], new="And now?",
        budget=2000)
    assert 0 < kept < 300


@pytest.mark.django_db
def test_the_system_prompt_and_the_new_message_are_sent_even_over_the_budget(alice, settings):
    settings.CHATSTREAM_SYSTEM_PROMPT = "Be brief. " * 50
    settings.CHATSTREAM_CONTEXT_TOKENS = 100
    conversation, _turns, _prompts = long_conversation(alice, 5, 10)
    new = "x" * 2000

    sent = build_history(new_generation(conversation, new))

    assert sent == [{"role": "system", "content": "Be brief. " * 50},
                    {"role": "user", "content": new}]


@pytest.mark.django_db
@pytest.mark.parametrize("system", ["", "You answer in French."], ids=["no-system", "system"])
def test_only_whole_turns_are_sent_whatever_the_budget(alice, settings, system):
    settings.CHATSTREAM_SYSTEM_PROMPT = system
    shuffle = random.Random(7)
    questions = [f"Q{i} " + "q" * shuffle.randrange(0, 300) for i in range(40)]
    replies = [None if shuffle.random() < 0.2 else f"A{i} " + "a" * shuffle.randrange(0, 900)
               for i in range(40)]
    conversation, turns, _prompts = conversation_with(alice, questions, replies)
    generation = new_generation(conversation, "Last one")

    seen = set()
    for budget in range(1, 12_000, 97):
        settings.CHATSTREAM_CONTEXT_TOKENS = budget
        sent = build_history(generation)
        seen.add(assert_newest_whole_turns_that_fit(
            sent, turns, system=[{"role": "system", "content": system}] if system else [],
            new="Last one", budget=budget))
    assert {0, 40} <= seen and len(seen) > 20


@pytest.mark.django_db
def test_a_models_own_context_tokens_override_the_default(alice, settings):
    settings.CHATSTREAM_CONTEXT_TOKENS = 16000
    settings.CHATSTREAM_MODELS = {
        "small": {"PROVIDER": "default", "MODEL": "fast", "CONTEXT_TOKENS": 600},
        "large": {"PROVIDER": "default", "MODEL": "fast"},
    }
    conversation, turns, _prompts = long_conversation(alice, 50, 200, model="small")
    small = build_history(new_generation(conversation, "Next", model="small"))
    large = build_history(Generation(conversation=conversation, user=alice, model="large",
                                     prompt_message=Message.objects.get(content="Next")))

    assert 0 < assert_newest_whole_turns_that_fit(small, turns, system=[], new="Next",
                                                  budget=600) < 50
    assert large == [*(m for turn in turns for m in turn), {"role": "user", "content": "Next"}]


@pytest.mark.django_db
@pytest.mark.parametrize(("budget", "most_queries"), [(400, 2), (16000, 8)],
                         ids=["a-few-turns", "hundreds-of-turns"])
def test_reading_is_bounded_by_what_is_sent_not_by_the_conversation(alice, settings, budget,
                                                                    most_queries):
    settings.CHATSTREAM_CONTEXT_TOKENS = budget
    conversation, turns, _prompts = long_conversation(alice, 1000, 80)  # 2,000 messages
    generation = new_generation(conversation)

    with CaptureQueriesContext(connection) as queries:
        sent = build_history(generation)

    kept = assert_newest_whole_turns_that_fit(sent, turns, system=[], new="The new question",
                                              budget=budget)
    assert 0 < kept < 1000
    reads = [q["sql"] for q in queries.captured_queries if "chatstream_message" in q["sql"]]
    questions = [sql for sql in reads if "LIMIT" in sql]
    assert questions and len(questions) <= most_queries
    # Each batch's replies are read by its questions' ids, and only then.
    replies = [sql for sql in reads if "LIMIT" not in sql]
    assert len(replies) <= len(questions) and all(" IN (" in sql for sql in replies), (
        "a read of the conversation without a LIMIT")
    limits = [re.search(r"LIMIT (\d+)", sql) for sql in questions]
    assert sum(int(limit.group(1)) for limit in limits if limit) <= 2 * kept + 16


@pytest.mark.django_db
def test_an_earlier_question_asked_again_and_again_has_only_its_latest_reply_read(alice):
    conversation, _turns, prompts = conversation_with(
        alice, ["First", "Second"], ["First reply", "Second reply"])
    for attempt in range(5):  # Retries of the first question, each with text of its own
        again = Generation.objects.create(conversation=conversation, user=alice, model="fast",
                                          prompt_message=prompts[0], status="completed",
                                          content=f"Retry {attempt}")
        Message.objects.create(conversation=conversation, role=Message.Role.ASSISTANT,
                               content=f"Retry {attempt}", generation=again,
                               created_at=prompts[1].created_at)

    with CaptureQueriesContext(connection) as queries:
        sent = build_history(new_generation(conversation, "Third"))

    assert [m["content"] for m in sent] == ["First", "Retry 4", "Second", "Second reply",
                                            "Third"]
    # Of the six replies with text to earlier questions, the texts of two are read: the
    # latest of each question's, not every one.
    texts = [q["sql"] for q in queries.captured_queries
             if '"chatstream_message"."content"' in q["sql"] and "LIMIT" not in q["sql"]]
    assert texts
    with connection.cursor() as cursor:
        for sql in texts:
            cursor.execute(sql)
            assert len(cursor.fetchall()) <= 2


@pytest.mark.django_db
def test_each_earlier_question_is_followed_by_its_latest_reply_with_text(alice, settings):
    settings.CHATSTREAM_CONTEXT_TOKENS = 16000
    conversation, _turns, prompts = conversation_with(
        alice, ["First", "Second", "Third"], ["First reply", None, "Third reply"])
    first, _second, third = prompts
    # A retry of the first question that wrote a newer reply, then one that wrote nothing.
    retry = Generation.objects.create(conversation=conversation, user=alice, model="fast",
                                      prompt_message=first, status="completed",
                                      content="Better first reply")
    Message.objects.create(conversation=conversation, role=Message.Role.ASSISTANT,
                           content="Better first reply", generation=retry,
                           created_at=third.created_at)
    Generation.objects.create(conversation=conversation, user=alice, model="fast",
                              prompt_message=first, status="failed")

    sent = build_history(new_generation(conversation, "Fourth"))

    assert sent == [{"role": "user", "content": "First"},
                    {"role": "assistant", "content": "Better first reply"},
                    {"role": "user", "content": "Second"},
                    {"role": "user", "content": "Third"},
                    {"role": "assistant", "content": "Third reply"},
                    {"role": "user", "content": "Fourth"}]


@pytest.mark.django_db
def test_a_retry_leaves_out_earlier_attempts_and_everything_after_its_question(alice):
    conversation, _turns, prompts = conversation_with(
        alice, ["First", "Second", "Third"], ["First reply", "Second reply", "Third reply"])
    retry = Generation(conversation=conversation, user=alice, model="fast",
                       prompt_message=prompts[1])

    assert build_history(retry) == [{"role": "user", "content": "First"},
                                    {"role": "assistant", "content": "First reply"},
                                    {"role": "user", "content": "Second"}]


@pytest.mark.django_db
def test_what_is_stored_for_a_new_message_is_bounded_by_the_budget(alice, client):
    conversation, _turns, _prompts = long_conversation(alice, 300, 8000)  # 4.8 MB of text

    client.post(url("message-create", conversation.pk), {"content": "x" * 8000}, **HTMX)

    generation = Generation.objects.get(prompt_message__content="x" * 8000)
    assert estimate_prompt(generation.upstream_messages) <= 16000
    assert len(json.dumps(generation.upstream_messages)) < 70_000


@pytest.mark.django_db(transaction=True)
def test_the_provider_receives_the_bounded_history_stored_at_the_post(
    make_user, browser_for, simulator, settings
):
    settings.CHATSTREAM_CONTEXT_TOKENS = 1500
    user = make_user()
    conversation, turns, _prompts = long_conversation(user, 200, 300)
    browser = browser_for(user)

    stream_url = browser.send(conversation.get_absolute_url(), "What next?", "fast")
    with browser.client.stream("GET", stream_url) as response:
        assert [name for _at, name, _data in read_events(response)][-1] == "done"

    sent = simulator.last_request.body["messages"]
    assert sent == Generation.objects.get(prompt_message__content="What next?").upstream_messages
    assert 0 < assert_newest_whole_turns_that_fit(sent, turns, system=[], new="What next?",
                                                  budget=1500) < 200


# --- the page window ------------------------------------------------------------------------------


def exchange_ids(html: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'<div class="cs-exchange" id="exchange-(\d+)"', html)]


def older_link(html: str) -> str | None:
    found = re.search(r'<a [^>]*href="(\?before=\d+)"[^>]*rel="prev"', html)
    return found.group(1) if found else None


def newer_link(html: str) -> str | None:
    found = re.search(r'<a [^>]*href="([^"]*)"[^>]*rel="next"', html)
    return found.group(1) if found else None


@pytest.mark.django_db
def test_the_page_shows_the_newest_exchanges_and_links_to_older_ones(alice, client):
    conversation, _turns, prompts = long_conversation(alice, 120, 10)
    every = [p.pk for p in prompts]
    page_url = conversation.get_absolute_url()

    html = client.get(page_url).content.decode()

    assert exchange_ids(html) == every[-50:]
    assert re.search(r'<form id="cs-composer"', html)
    assert newer_link(html) is None
    pages, link = [exchange_ids(html)], older_link(html)
    while link:
        response = client.get(page_url + link)
        assert response.status_code == 200
        older = response.content.decode()
        assert 'id="cs-composer"' not in older, "a composer on a page of earlier messages"
        pages.append(exchange_ids(older))
        link = older_link(older)
    assert [len(page) for page in pages] == [50, 50, 20]
    assert [pk for page in reversed(pages) for pk in page] == every  # none lost, none twice

    # And forward again, from the oldest page back to the newest.
    forward, link = [], newer_link(older)
    while link:
        html = client.get(link if link.startswith("/") else page_url + link).content.decode()
        forward.append(exchange_ids(html))
        link = newer_link(html)
    assert forward == [pages[1], pages[0]]


@pytest.mark.django_db
def test_the_newest_exchange_and_its_streaming_reply_stay_on_the_default_page(alice, client):
    conversation, _turns, _prompts = long_conversation(alice, 120, 10)
    live = new_generation(conversation, "Still being answered")
    live.status = Generation.Status.STREAMING
    live.save()

    html = client.get(conversation.get_absolute_url()).content.decode()

    assert exchange_ids(html)[-1] == live.prompt_message_id
    assert f'id="generation-{live.pk}"' in html and "sse-connect" in html
    assert re.search(r'<form id="cs-composer"', html)


@pytest.mark.django_db
@pytest.mark.parametrize("before", ["abc", "0", "99999999"], ids=["not-a-number", "zero",
                                                                  "unknown"])
def test_a_page_before_a_message_not_in_the_conversation_is_not_found(alice, client, before):
    conversation, _turns, _prompts = long_conversation(alice, 3, 10)
    _other, _turns, other_prompts = long_conversation(alice, 3, 10)
    assert client.get(f"{conversation.get_absolute_url()}?before={before}").status_code == 404
    response = client.get(f"{conversation.get_absolute_url()}?before={other_prompts[-1].pk}")
    assert response.status_code == 404


@pytest.mark.django_db
def test_the_page_makes_as_many_queries_for_120_exchanges_as_for_3(alice, client):
    def page_queries(count: int, *, earlier: bool = False) -> int:
        conversation, _turns, prompts = long_conversation(alice, count, 10)
        for prompt in prompts:  # a second attempt at every question
            Generation.objects.create(conversation=conversation, user=alice, model="fast",
                                      prompt_message=prompt, status="cancelled", content="Half")
        page = conversation.get_absolute_url() + (f"?before={prompts[-60].pk}" if earlier else "")
        with CaptureQueriesContext(connection) as captured:
            assert client.get(page).status_code == 200
        return len(captured)

    few = page_queries(3)
    assert page_queries(120) == few <= 10
    # A page of earlier exchanges also reads the message it ends before, and the next page's.
    assert page_queries(120, earlier=True) == few + 2


@pytest.mark.django_db
def test_the_page_size_is_bounded_by_the_window(alice, client):
    conversation, _turns, _prompts = long_conversation(alice, 120, 4000)
    html = client.get(conversation.get_absolute_url()).content.decode()
    assert len(exchange_ids(html)) == 50
    # The text of 50 exchanges, each reply's tools (feedback, details, copy: ~2 KB), and the
    # page around them; a page holding all 120 would be over twice as long.
    assert len(html) < 50 * (8000 + 2500) + 60_000


@pytest.mark.django_db
def test_the_window_follows_the_page_size_setting(alice, client, settings):
    settings.CHATSTREAM_CONVERSATION_PAGE_SIZE = 7
    conversation, _turns, prompts = long_conversation(alice, 10, 10)
    html = client.get(conversation.get_absolute_url()).content.decode()
    assert exchange_ids(html) == [p.pk for p in prompts[-7:]]
    assert older_link(html) == f"?before={prompts[3].pk}"


@pytest.mark.django_db
def test_a_retry_without_javascript_returns_to_the_page_showing_its_exchange(alice, client):
    conversation, _turns, prompts = long_conversation(alice, 120, 10)
    failed = Generation.objects.create(conversation=conversation, user=alice, model="fast",
                                       prompt_message=prompts[10], status="failed")
    recent = Generation.objects.create(conversation=conversation, user=alice, model="fast",
                                       prompt_message=prompts[-1], status="failed")

    old = client.post(url("generation-retry", failed.pk))
    new = client.post(url("generation-retry", recent.pk))

    assert old.status_code == 302
    page = client.get(old["Location"]).content.decode()
    assert prompts[10].pk in exchange_ids(page)
    assert old["Location"].endswith(f"#exchange-{prompts[10].pk}")
    assert new["Location"] == f"{conversation.get_absolute_url()}#exchange-{prompts[-1].pk}"


# --- the limit on messages per conversation -------------------------------------------------------


def filled(user: Any, count: int) -> tuple[Conversation, list[Message]]:
    conversation, _turns, prompts = long_conversation(user, count, 5)
    return conversation, prompts


@pytest.mark.django_db
def test_the_message_after_the_limit_is_refused_with_a_sentence(alice, client, simulator):
    conversation, _prompts = filled(alice, 500)
    generations = Generation.objects.count()

    with CaptureQueriesContext(connection) as queries:
        response = client.post(url("message-create", conversation.pk), {"content": "501st"},
                               **HTMX)

    assert response.status_code == 409
    assert response.content.decode().strip() == (
        '<p class="cs-notice cs-refusal" role="alert">This conversation has reached its limit '
        "of 500 messages. Start a new conversation to continue.</p>")
    assert not Message.objects.filter(content="501st").exists()
    assert Generation.objects.count() == generations and not simulator.requests
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"]]
    assert len(counts) == 1 and "chatstream_message" in counts[0]
    assert not any('"content"' in q["sql"] for q in queries.captured_queries
                   if "chatstream_message" in q["sql"]), "message text read to count them"


@pytest.mark.django_db
def test_without_javascript_the_refused_message_shows_the_page_with_a_new_conversation_button(
    alice, client
):
    conversation, _prompts = filled(alice, 500)

    response = client.post(url("message-create", conversation.pk), {"content": "501st"})

    assert response.status_code == 409
    html = response.content.decode()
    assert "reached its limit of 500 messages. Start a new conversation to continue." in html
    assert re.search(r'<form method="post" action="/chat/new/"', html)
    assert re.search(r'<button type="submit" class="cs-button cs-primary">.*New conversation'
                     r"</button>", html)
    assert not Message.objects.filter(content="501st").exists()


@pytest.mark.django_db
def test_a_full_conversation_composer_invites_a_new_conversation_not_another_message(alice,
                                                                                    client):
    full, _prompts = filled(alice, 500)
    almost, _prompts = filled(alice, 499)

    html = client.get(full.get_absolute_url()).content.decode()

    assert 'name="content"' not in html and 'id="cs-composer"' not in html
    assert "reached its limit of 500 messages. Start a new conversation to continue." in html
    assert re.search(r'<input type="hidden" name="model" value="fast">', html)
    assert 'id="cs-notice"' in html  # where a refused Retry is still explained
    assert re.search(r'<form id="cs-composer"',
                     client.get(almost.get_absolute_url()).content.decode())


@pytest.mark.django_db
def test_the_last_allowed_message_is_accepted(alice, client, settings):
    settings.CHATSTREAM_MAX_CONVERSATION_MESSAGES = 3
    conversation, _prompts = filled(alice, 2)
    accepted = client.post(url("message-create", conversation.pk), {"content": "Third"}, **HTMX)
    refused = client.post(url("message-create", conversation.pk), {"content": "Fourth"}, **HTMX)
    assert (accepted.status_code, refused.status_code) == (200, 409)
    assert "limit of 3 messages" in refused.content.decode()


@pytest.mark.django_db
def test_a_retry_in_a_full_conversation_is_allowed(alice, client):
    conversation, prompts = filled(alice, 500)
    failed = Generation.objects.create(conversation=conversation, user=alice, model="fast",
                                       prompt_message=prompts[-1], status="failed")

    response = client.post(url("generation-retry", failed.pk), **HTMX)

    assert response.status_code == 200
    assert Generation.objects.filter(retry_of=failed).exists()


@pytest.mark.django_db
def test_another_users_full_conversation_is_still_not_found(alice, client):
    bob = get_user_model().objects.create_user("bob")
    conversation, _prompts = filled(bob, 500)
    response = client.post(url("message-create", conversation.pk), {"content": "x"}, **HTMX)
    assert response.status_code == 404

"""A reasoning model's thinking: read apart from the reply, streamed before it on its own event,
stored with the generation (and its token count), shown in the page, the API and the admin.

The upstream is the simulator's ``reasoning`` option (``delta.reasoning_content`` pieces before
the text, ``reasoning_tokens`` in usage); the app runs under uvicorn as a browser would use it.
"""

from __future__ import annotations

import html
import json
import re
import uuid
from typing import Any

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from chatstream import api
from chatstream.completions import ChatCompletionAccumulator
from chatstream.domain.usage import provider_usage
from chatstream.models import Conversation, Generation, Message
from chatstream.sse import SSEDecoder
from chatstream.testing import SCENARIOS, Script, tokenize

from .conftest import generation_id, read_events
from .test_fast_streams import alias, checkpoint_elsewhere, pending_in  # noqa: F401
from .workers import DATABASES

Status = Generation.Status

# Markup, entities, line ends of every kind and an attempt at forging an event: all text.
REASONING = ("Let me think <b>hard</b> &amp; <script>alert(1)</script>.\r\n"
             "Second line\rthird line\n\nevent: done\ndata: <i>forged</i>\n\n"
             "id: 99\nDone \U0001f914")
TEXT = "The answer is 42."


def as_sent(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def thinking_model(simulator: Any, use_model: Any, **options: Any) -> str:
    """Allow-list a model that thinks ``REASONING`` then says ``TEXT`` (or as ``options`` say)."""
    fields = {"reasoning": REASONING, "text": TEXT, "tokens_per_second": 200,
              "first_token_delay": 0, **options}
    simulator.register("thinker", Script(**fields))
    return use_model("thinker")


def chunk(delta: dict[str, Any], index: int = 0) -> str:
    return json.dumps({"choices": [{"index": index, "delta": delta}]})


# --- the accumulator ------------------------------------------------------------------------------


@pytest.mark.parametrize(("delta", "thought", "said"), [
    ({"reasoning_content": "Hmm."}, "Hmm.", ""),
    ({"content": None, "reasoning": "Hmm."}, "Hmm.", ""),
    ({"reasoning_content": "Hmm.", "reasoning": "Hmm."}, "Hmm.", ""),
    ({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": "Hmm."}]},
                  {"type": "text", "text": "Yes."}]}, "Hmm.", "Yes."),
    ({"content": [{"type": "thinking", "thinking": "Hmm."}]}, "Hmm.", ""),
    ({"content": "Yes."}, "", "Yes."),
], ids=["deepseek", "vllm", "both-once", "mistral-blocks", "mistral-string", "content-only"])
def test_each_feed_says_the_reasoning_it_added_apart_from_the_text(delta, thought, said):
    acc = ChatCompletionAccumulator()
    acc.feed(chunk({"reasoning_content": "Before. "}))
    assert acc.feed(chunk(delta)) == said
    assert acc.reasoning_added == thought
    assert acc.choices[0].reasoning == "Before. " + thought
    acc.feed("[DONE]")
    assert acc.reasoning_added == ""


def test_only_the_first_choices_reasoning_is_said():
    acc = ChatCompletionAccumulator()
    acc.feed(chunk({"reasoning_content": "Other."}, index=1))
    assert acc.reasoning_added == "" and acc.choices[1].reasoning == "Other."


@given(st.lists(st.text(min_size=1), min_size=1, max_size=8), st.lists(st.text(), max_size=8))
def test_the_reasoning_said_piece_by_piece_is_the_whole_reasoning(thoughts, texts):
    acc = ChatCompletionAccumulator()
    said = ""
    for thought in thoughts:
        acc.feed(chunk({"content": None, "reasoning_content": thought}))
        said += acc.reasoning_added
        assert acc.choices[0].reasoning  # a read between feeds (a checkpoint) changes nothing
    for text in texts:
        acc.feed(chunk({"content": text}))
        assert acc.reasoning_added == ""
    assert said == acc.choices[0].reasoning == "".join(thoughts)
    assert acc.content == "".join(texts)


@pytest.mark.parametrize(("details", "expected"), [
    ({"reasoning_tokens": 7}, 7),
    ({"reasoning_tokens": 0}, 0),
    ({"reasoning_tokens": 11}, None),  # more than the completion tokens
    ({"reasoning_tokens": -1}, None),
    ({"reasoning_tokens": True}, None),
    ({"reasoning_tokens": "7"}, None),
    ({}, None),
    (None, None),
])
def test_reasoning_tokens_are_the_providers_figure_when_plausible(details, expected):
    usage = {"prompt_tokens": 5, "completion_tokens": 10, "completion_tokens_details": details}
    assert provider_usage(usage)["reasoning_tokens"] == expected  # type: ignore[index]


# --- the simulator --------------------------------------------------------------------------------


def test_the_simulator_thinks_before_it_replies_and_counts_the_thinking(simulator):
    body = {"model": "thinking?tps=0&first_token_delay=0",
            "messages": [{"role": "user", "content": "Hi"}], "stream": True,
            "stream_options": {"include_usage": True}}
    response = httpx.post(simulator.base_url + "/chat/completions", json=body)
    decoder, acc = SSEDecoder(), ChatCompletionAccumulator()
    order = []
    for event in decoder.feed(response.content):
        if acc.feed(event.data):
            order.append("text")
        elif acc.reasoning_added:
            order.append("thinking")
    script = SCENARIOS["thinking"]
    assert acc.choices[0].reasoning == script.reasoning and acc.content == script.text
    assert order == sorted(order, key=lambda kind: kind == "text") and "thinking" in order
    thinking, text = len(tokenize(script.reasoning)), len(tokenize(script.text))
    assert acc.usage["completion_tokens_details"]["reasoning_tokens"] == thinking
    assert acc.usage["completion_tokens"] == thinking + text
    assert simulator.last_request.chunks_sent == thinking + text  # faults count them too

    plain = httpx.post(simulator.base_url + "/chat/completions",
                       json={**body, "stream": False}).json()
    assert plain["choices"][0]["message"]["reasoning_content"] == script.reasoning


# --- the page's stream ----------------------------------------------------------------------------

end_to_end = pytest.mark.django_db(transaction=True)


def raw_stream(browser: Any, url: str) -> bytes:
    with browser.client.stream("GET", url) as response:
        assert response.status_code == 200
        return b"".join(response.iter_raw())


@end_to_end
def test_thinking_streams_before_the_reply_escaped_and_never_counted_in_its_ids(
    make_user, browser_for, simulator, use_model
):
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", thinking_model(simulator, use_model))
    raw = raw_stream(browser, url).decode()
    blocks = [b for b in raw.split("\n\n") if b.startswith("event:")]
    names = [b.split("\n", 1)[0].removeprefix("event: ") for b in blocks]
    assert names.count("done") == 1 and names[-1] == "done"
    first_delta = names.index("delta")
    assert "thinking" in names and "thinking" not in names[first_delta:]
    thinking = [b for b in blocks if b.startswith("event: thinking")]
    assert not [b for b in thinking if "\nid:" in b]
    streamed = "\n".join(
        "\n".join(line.removeprefix("data: ") for line in b.split("\n")[1:]) for b in thinking)
    assert "<" not in streamed  # escaped: the markup is text
    assert html.unescape(streamed.replace("\n", "")) == as_sent(REASONING).replace("\n", "")
    # Reasoning never counts: the first delta's id is the length of its own text.
    first = blocks[first_delta].split("\n")
    assert first[1] == f"id: {len(html.unescape(first[2].removeprefix('data: ')))}"

    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status == Status.COMPLETED
    assert (generation.reasoning, generation.content) == (REASONING, TEXT)
    assert generation.reasoning_tokens == len(tokenize(REASONING))
    assert generation.completion_tokens == len(tokenize(REASONING)) + len(tokenize(TEXT))
    assert generation.first_token_at is not None
    done = blocks[-1]
    assert 'class="cs-thinking"' in done and "Thought for" in done
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in done and "<script>" not in done


@end_to_end
def test_the_page_stream_and_the_stored_rendering_show_the_same_text(
    make_user, browser_for, simulator, use_model
):
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", thinking_model(simulator, use_model))
    events = SSEDecoder().feed(raw_stream(browser, url))
    streamed = "".join(e.data for e in events if e.event == "thinking")
    assert events[-1].event == "done"
    shown = re.search(r'<div class="cs-thinking-text">(.*?)</div>', events[-1].data, re.S)
    assert shown is not None
    # As the browser reads them: the HTML parser takes a CR or CRLF for an LF.
    stored = html.unescape(shown.group(1)).replace("\r\n", "\n").replace("\r", "\n")
    assert stored == html.unescape(streamed) == as_sent(REASONING)


@end_to_end
def test_the_json_api_streams_thinking_as_raw_text_and_stores_it_with_the_generation(
    make_user, browser_for, simulator, use_model
):
    browser = browser_for(make_user())
    headers = {"X-CSRFToken": browser.csrf}
    conversation = browser.client.post("/chat/api/conversations/", json={},
                                       headers=headers).json()
    sent = browser.client.post(conversation["messages_url"], headers=headers, json={
        "content": "Hi", "model": thinking_model(simulator, use_model)}).json()
    events = SSEDecoder().feed(browser.client.get(sent["stream_url"]).content)
    thinking = [json.loads(e.data)["text"] for e in events if e.event == "thinking"]
    assert "".join(thinking) == as_sent(REASONING)
    assert [e.event for e in events if e.event != "ping"].index("delta") == len(thinking)
    done = json.loads(events[-1].data)
    assert done["reasoning"] == REASONING and done["content"] == TEXT
    assert done["usage"]["reasoning_tokens"] == len(tokenize(REASONING))


@pytest.fixture
def user(make_user: Any) -> Any:
    return make_user()


@end_to_end
async def test_python_code_streaming_a_reply_gets_its_text_alone(user, simulator, use_model):
    generation = await api.asend(user, "Hi", model=thinking_model(simulator, use_model))
    pieces = [piece async for piece in api.astream(generation)]
    assert "".join(pieces) == TEXT
    stored = await Generation.objects.aget(pk=generation.pk)
    assert stored.reasoning == REASONING


@end_to_end
def test_thinking_is_checkpointed_shown_to_a_page_loaded_then_and_kept_when_stopped(
    make_user, browser_for, simulator, use_model, settings
):
    settings.CHATSTREAM_CHECKPOINT_INTERVAL = 0.1
    model = thinking_model(simulator, use_model, reasoning="Thinking slowly. " * 40,
                           tokens_per_second=20)
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    url = browser.send(conversation, "Hi", model)
    gid = generation_id(url)
    with browser.client.stream("GET", url) as response:
        events = read_events(response)  # kept referenced: the page stays connected meanwhile
        for _at, name, _data in events:
            assert name in ("thinking", "ping")
            row = Generation.objects.get(pk=gid)
            if row.reasoning.count("slowly") >= 3:
                break
        assert row.status == Status.STREAMING and row.content == ""
        assert "Thinking slowly. Thinking slowly." in row.reasoning
        page = browser.client.get(conversation).text
        live = page.split(f'id="generation-{gid}"', 1)[1]
        assert '<details class="cs-thinking" data-state="thinking"' in live
        assert 'sse-swap="thinking"' in live and row.reasoning[:60] in live
        assert "Thinking…" in live
        stop = browser.post(reverse("chatstream:generation-cancel", args=[gid]))
        assert stop.status_code < 300
        rest = [name for _at, name, _data in events]
        assert rest[-1] == "done" and "delta" not in rest
    generation = Generation.objects.get(pk=gid)
    assert generation.status == Status.CANCELLED and generation.content == ""
    assert generation.reasoning.startswith("Thinking slowly. Thinking slowly. Thinking slowly.")
    assert simulator.last_request.wait_closed(5) and simulator.last_request.client_closed


@end_to_end
def test_a_long_reasoning_is_cut_within_the_replys_bounds(
    make_user, browser_for, simulator, use_model, settings
):
    settings.CHATSTREAM_MAX_REPLY_LENGTH = 300
    model = thinking_model(simulator, use_model, reasoning="Round and round. " * 500,
                           tokens_per_second=400)
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", model)
    raw = raw_stream(browser, url).decode()
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status != Status.COMPLETED and generation.error_type == "reply_too_long"
    assert 300 < len(generation.reasoning) < 17 * 500 // 2
    assert ("Round and round. " * 500).startswith(generation.reasoning)
    assert simulator.last_request.client_closed or not simulator.last_request.completed
    assert raw.count("event: delta") == 0


# --- rendering ------------------------------------------------------------------------------------


def make_generation(**fields: Any) -> Generation:
    user = get_user_model().objects.create_user(f"u{uuid.uuid4().hex[:8]}")
    conversation = Conversation.objects.create(user=user, model="fast")
    prompt = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                    content="Hi")
    return Generation.objects.create(conversation=conversation, user=user,
                                     prompt_message=prompt, model="fast", **fields)


def render(generation: Generation, final: bool = False) -> str:
    return render_to_string("chatstream/includes/generation.html",
                            {"generation": generation, "final": final})


@pytest.mark.django_db
def test_a_finished_reply_shows_its_thinking_collapsed_above_its_text_as_plain_text():
    now = timezone.now()
    generation = make_generation(
        status=Status.COMPLETED, content="Answer", reasoning="<b>bold</b>\nnext line",
        started_at=now - timezone.timedelta(seconds=4.4), first_token_at=now, completed_at=now)
    shown = render(generation, final=True)
    assert shown.index('class="cs-thinking"') < shown.index("cs-text")
    assert "<details class=\"cs-thinking\">" in shown  # collapsed: no `open`
    assert "Thought for 4 s" in shown
    assert ('<div class="cs-thinking-text">&lt;b&gt;bold&lt;/b&gt;\nnext line</div>' in shown)


@pytest.mark.django_db
def test_a_reply_without_thinking_shows_none():
    assert "cs-thinking" not in render(make_generation(status=Status.COMPLETED, content="A"))
    live = render(make_generation(status=Status.PENDING))
    assert re.search(r'<details class="cs-thinking" hidden data-state="thinking"', live)


@pytest.mark.django_db
def test_a_reply_stopped_while_it_thought_says_thinking_without_a_time():
    generation = make_generation(status=Status.CANCELLED, reasoning="Hmm",
                                 started_at=timezone.now())
    shown = render(generation, final=True)
    assert ">Thinking</summary>" in shown and "Thought for" not in shown


# --- the admin ------------------------------------------------------------------------------------

SECRET_THOUGHT = "TOPSECRET-THOUGHT <b>plans</b>\nsecond line"


@pytest.fixture
def thought() -> Generation:
    now = timezone.now()
    return make_generation(status=Status.COMPLETED, content="Reply", reasoning=SECRET_THOUGHT,
                           reasoning_tokens=321, completion_tokens=400, started_at=now,
                           first_token_at=now, completed_at=now)


def staff_client(client: Any, *codenames: str) -> Any:
    user = get_user_model().objects.create_user(f"s{uuid.uuid4().hex[:8]}", password="pw",
                                                is_staff=True)
    for codename in ("view_generation", "view_conversation", "view_message", *codenames):
        user.user_permissions.add(Permission.objects.get(content_type__app_label="chatstream",
                                                         codename=codename))
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_the_admin_shows_the_reasoning_to_content_readers_only(client, thought):
    page = f"/admin/chatstream/generation/{thought.pk}/change/"
    reader = staff_client(client, "view_generation_content").get(page).content.decode()
    assert "TOPSECRET-THOUGHT &lt;b&gt;plans&lt;/b&gt;<br>second line" in reader
    assert "321" in reader
    others = staff_client(client).get(page).content.decode()
    assert "TOPSECRET" not in others and "321" in others  # the count is metadata
    assert "Reasoning" in others and "hidden: you lack the permission" in others
    thought.reasoning = ""
    thought.save()
    assert "Reasoning</h2>" not in staff_client(client, "view_generation_content").get(
        page).content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize("where", [
    "/admin/chatstream/generation/?reasoning__icontains=TOPSECRET",
    "/admin/chatstream/generation/export.csv",
    "/admin/chatstream/generation/export.jsonl",
])
def test_the_reasoning_cannot_be_probed_without_the_content_permission(client, thought, where):
    response = staff_client(client).get(where)
    text = b"".join(response.streaming_content) if response.streaming else response.content
    assert b"TOPSECRET" not in text
    if "reasoning__" in where:
        assert response.status_code == 400


# --- the checkpoints' SQL -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.parametrize("path", ["thread", "event-loop"])
def test_a_checkpoint_writes_the_reasoning_apart_from_the_text(alias, path):  # noqa: F811
    rows = Generation.objects.using(alias)
    thinking, writing, silent = (pending_in(alias) for _ in range(3))
    rows.filter(pk__in=[thinking.pk, writing.pk, silent.pk]).update(
        status="streaming", content="Earlier", reasoning="Thought")
    now = timezone.now()
    assert checkpoint_elsewhere(alias, {
        thinking.pk: {"heartbeat_at": now, "reasoning": "Thought more ✓"},
        writing.pk: {"heartbeat_at": now, "content": "Earlier and more", "first_token_at": now},
        silent.pk: {"heartbeat_at": now},
    }, path) == set()
    got = {g.pk: (g.content, g.reasoning) for g in rows.filter(
        pk__in=[thinking.pk, writing.pk, silent.pk])}
    assert got == {thinking.pk: ("Earlier", "Thought more ✓"),
                   writing.pk: ("Earlier and more", "Thought"),
                   silent.pk: ("Earlier", "Thought")}

"""End to end: the app under uvicorn, the simulated upstream over loopback, an HTTP client."""

from __future__ import annotations

import time

import pytest

from chatstream.models import Generation, Message

from .conftest import API_KEY, generation_id, read_events

pytestmark = pytest.mark.django_db(transaction=True)


def test_reply_streams_incrementally_and_is_stored_field_by_field(
    make_user, browser_for, simulator, use_model
):
    model = use_model("default?tps=40")
    user = make_user()
    browser = browser_for(user)
    conversation = browser.new_conversation()
    stream_url = browser.send(conversation, "How does streaming work?", model)

    events = []
    with browser.client.stream("GET", stream_url) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-store"
        assert response.headers["x-accel-buffering"] == "no"
        for arrival, name, data in read_events(response):
            upstream = simulator.last_request
            events.append((arrival, name, data, upstream.completed if upstream else None))

    deltas = [e for e in events if e[1] == "delta"]
    assert len(deltas) >= 3
    # The first deltas reached us while the upstream was still sending.
    assert deltas[0][3] is False
    assert deltas[-1][0] - deltas[0][0] > 0.5  # spread over the reply, not one burst
    assert events[-1][1] == "done"

    upstream = simulator.last_request
    assert upstream.completed and not upstream.client_closed
    generation = Generation.objects.get(pk=generation_id(stream_url))
    assert generation.status == Generation.Status.COMPLETED
    assert generation.user == user
    assert generation.model == model
    assert generation.provider_model == upstream.body["model"].split("?")[0]  # as reported
    assert generation.request_id == upstream.id
    assert generation.http_status == 200
    assert generation.finish_reason == "stop"
    assert generation.usage_source == Generation.UsageSource.PROVIDER
    assert generation.completion_tokens == upstream.chunks_sent
    assert generation.prompt_tokens and generation.prompt_tokens > 0
    assert generation.started_at <= generation.first_token_at <= generation.completed_at
    assert generation.error_type == "" and generation.reason == ""
    # The text is exactly what the browser was sent (deltas are HTML-escaped on the wire).
    import html

    assert html.unescape("".join(e[2] for e in deltas)) == generation.content
    assert generation.content.startswith("Sure!")
    reply = Message.objects.get(generation=generation)
    assert reply.role == Message.Role.ASSISTANT and reply.content == generation.content
    # The upstream got the stored conversation and the server-side parameters only.
    body = upstream.body
    assert body["messages"] == [{"role": "user", "content": "How does streaming work?"}]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 1024
    assert upstream.headers["authorization"] == "Bearer ***" + API_KEY[-4:]  # recorded redacted


def test_second_request_for_a_finished_generation_replays_without_a_new_upstream_call(
    make_user, browser_for, simulator
):
    browser = browser_for(make_user())
    stream_url = browser.send(browser.new_conversation(), "Hi", "fast")
    first = browser.client.get(stream_url).text
    again = browser.client.get(stream_url).text
    assert len(simulator.requests) == 1
    assert "event: done" in again
    stored = Generation.objects.get(pk=generation_id(stream_url)).content
    assert stored and "event: done" in first
    # The replay carries the stored text once.
    import html

    replayed = [line[6:] for line in again.split("\n") if line.startswith("data: ")]
    assert html.unescape(replayed[0]) == stored.split("\n")[0]


def test_history_sent_upstream_is_the_stored_conversation(make_user, browser_for, simulator):
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    browser.client.get(browser.send(conversation, "First question", "fast"))
    first_reply = Generation.objects.get().content
    browser.client.get(browser.send(conversation, "Second question", "fast"))
    assert simulator.last_request.body["messages"] == [
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": first_reply},
        {"role": "user", "content": "Second question"},
    ]


def test_deltas_arrive_before_the_upstream_finishes(make_user, browser_for, simulator, use_model):
    model = use_model("default?tps=20")
    browser = browser_for(make_user())
    stream_url = browser.send(browser.new_conversation(), "Hi", model)
    with browser.client.stream("GET", stream_url) as response:
        for _arrival, name, _data in read_events(response):
            if name == "delta":
                first_delta_at = time.monotonic()
                break
    record = simulator.last_request
    assert record.wait_closed(5)
    # We left after the first delta: the upstream had far from finished, and saw us go.
    assert record.client_closed
    assert record.chunks_sent_at_close < 20
    assert record.client_closed_at - first_delta_at < 2

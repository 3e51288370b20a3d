"""The tool loop against a real OpenAI-compatible server: llama.cpp's, on loopback, serving a
scripted model (``tiny_llamacpp``) that asks for two tool calls in one reply, then answers in
text once it has their results.

What it shows that the simulator cannot: chatstream's request (its tools' schemas, then the
assistant message with ``tool_calls`` and the ``tool`` messages) is one a real server takes and
renders into its model's prompt, and the calls that server streams (``delta.tool_calls``
fragments, its own call ids) are read, run and answered as steps of one reply.

Needs xllamacpp (llama.cpp's server, prebuilt) and gguf: ``make test-real-servers`` installs
them in a virtualenv of its own and runs this module; without them it is skipped.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from chatstream import api, provider
from chatstream.models import Generation, ToolCall
from chatstream.tools import tool

from . import tiny_llamacpp

MISSING = [name for name in ("xllamacpp", "gguf") if importlib.util.find_spec(name) is None]

pytestmark = [
    pytest.mark.skipif(bool(MISSING), reason=f"needs {' and '.join(MISSING)} installed "
                       "(make test-real-servers installs them)"),
    pytest.mark.django_db(transaction=True),
]

ran: list[tuple[str, str]] = []


@tool
def get_weather(city: str) -> dict[str, str]:
    """The weather in a city."""
    ran.append(("get_weather", city))
    return {"city": city, "sky": "clear"}


@tool
async def get_time(timezone: str) -> str:
    """The time in a timezone."""
    ran.append(("get_time", timezone))
    return "12:00"


@pytest.fixture(scope="module")
def llamacpp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama.cpp's server, serving the scripted model on a free loopback port: its base URL."""
    folder = tmp_path_factory.mktemp("llamacpp")
    model, log_path = folder / "tiny.gguf", folder / "server.log"
    tiny_llamacpp.write_model(str(model))
    with log_path.open("w") as log, subprocess.Popen(
            [sys.executable, tiny_llamacpp.__file__, str(model)],
            stdout=subprocess.PIPE, stderr=log, text=True) as server:
        try:
            assert server.stdout is not None
            address = server.stdout.readline().strip()
            if not address.startswith("http://127.0.0.1:"):
                pytest.fail(f"llama.cpp's server did not start:\n{log_path.read_text()}")
            yield f"{address}/v1"
        finally:
            server.terminate()  # then the with waits for it


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The body of each request chatstream sends upstream, in order."""
    bodies: list[dict[str, Any]] = []
    build = provider.build_request

    def recording(*args: Any, **kwargs: Any) -> provider.UpstreamRequest:
        request = build(*args, **kwargs)
        bodies.append(request.body)
        return request

    monkeypatch.setattr(provider, "build_request", recording)
    return bodies


def test_two_calls_in_one_step_run_and_the_next_step_answers_with_their_results(
        llamacpp: str, settings: Any, make_user: Any, sent: list[dict[str, Any]]) -> None:
    settings.CHATSTREAM_PROVIDERS = {"llamacpp": {"BASE_URL": llamacpp}}
    settings.CHATSTREAM_MODELS = {"tiny": {
        "PROVIDER": "llamacpp", "MODEL": "tiny",
        "TOOLS": [f"{__name__}.get_weather", f"{__name__}.get_time"]}}
    ran.clear()
    first = api.send(make_user(), "Weather and time in Paris?")
    last = api.run(first)

    # Step 1 offered both tools; the model asked for both in one reply, and both ran.
    first_request, second_request = sent
    assert [t["function"]["name"] for t in first_request["tools"]] == ["get_weather", "get_time"]
    calls = list(ToolCall.objects.filter(generation=first))
    assert [(c.name, c.arguments, c.status) for c in calls] == [
        ("get_weather", '{"city": "Paris"}', ToolCall.Status.SUCCEEDED),
        ("get_time", '{"timezone": "Europe/Paris"}', ToolCall.Status.SUCCEEDED),
    ]
    assert sorted(ran) == [("get_time", "Europe/Paris"), ("get_weather", "Paris")]
    # The server's own call ids, one per call, pair each result with its call.
    assert calls[0].call_id and calls[1].call_id and calls[0].call_id != calls[1].call_id

    # Step 2 carried the calls and their results, and the model answered in text.
    assert (last.step, last.follows_id) == (2, first.pk)
    assert (last.status, last.content) == (Generation.Status.COMPLETED, "Both tools answered.")
    messages = second_request["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == [c.call_id for c in calls]
    assert [m["tool_call_id"] for m in messages[2:]] == [c.call_id for c in calls]
    assert json.loads(messages[2]["content"]) == {"city": "Paris", "sky": "clear"}
    assert messages[3]["content"] == "12:00"

"""What the telemetry costs a reply: the calls the engine makes per reply (the reply's span,
one attempt's span, its first chunk, its end with usage, the reply's end), without an SDK (the
API's no-ops) and with the SDK (spans through a BatchSpanProcessor to an exporter that drops
them, metrics aggregated for a reader), in µs per reply; and per delta: a whole stream of N
chunks through the chunk assembler with and without those calls, whose difference is the same
per reply whatever N (the engine makes no call per delta).

    .venv/bin/python bench/bench_telemetry.py [--rounds 7] [--replies 10000]   # ~2 minutes

Each setup runs in a process of its own (OpenTelemetry's providers are set once per process);
within one, rounds alternate the variants. Not a test; prints medians of the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SETUPS = {
    "none": "no SDK (the API's no-ops)",
    "sdk": "SDK: batch span processor, dropping exporter; metrics aggregated",
    "sdk-content": "SDK as above, CHATSTREAM_TELEMETRY_CONTENT on",
    "sdk-unsampled": "SDK, sampler ALWAYS_OFF (spans not recorded; metrics aggregated)",
}
DELTAS = (100, 1000)
STREAMED_DELTAS = 200_000  # per variant, per round
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Tell me about the weather in Paris. " * 20}]


def configure(setup: str) -> None:
    from django.conf import settings

    settings.configure(
        CHATSTREAM_PROVIDERS={"main": {"BASE_URL": "https://llm.example.com/v1",
                                       "NAME": "openai"}},
        CHATSTREAM_MODELS={"mini": {"PROVIDER": "main", "MODEL": "gpt-mini"}},
        CHATSTREAM_TELEMETRY_CONTENT=setup == "sdk-content")
    if setup == "none":
        return
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    class Dropping(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    sampler = ParentBased(ALWAYS_OFF) if setup == "sdk-unsampled" else None
    provider = TracerProvider(sampler=sampler) if sampler else TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropping()))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


def one_reply(telemetry: Any, model: Any, generation: Any, request: dict[str, Any]) -> None:
    reply = telemetry.reply(generation)
    attempt = reply.attempt(model, 1, request=request)
    attempt.first_chunk(response_model="gpt-mini-2025")
    attempt.end(response_model="gpt-mini-2025", response_id="chatcmpl-1",
                finish_reasons=["stop"], input_tokens=250, output_tokens=400,
                text="It is rainy. " * 50)
    reply.end()


def chunks(n: int) -> list[str]:
    head = '{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-mini-2025",'
    data = [head + '"choices":[{"index":0,"delta":{"content":"abcd"}}]}'] * n
    data.append(head + '"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
                '"usage":{"prompt_tokens":250,"completion_tokens":400}}')
    return [*data, "[DONE]"]


def stream(telemetry: Any, model: Any, generation: Any, request: dict[str, Any],
           data: list[str], traced: bool) -> None:
    """One reply's chunks through the assembler, as the pump reads them."""
    from chatstream.completions import ChatCompletionAccumulator

    acc = ChatCompletionAccumulator()
    if traced:
        reply = telemetry.reply(generation)
        attempt = reply.attempt(model, 1, request=request)
    first = True
    for item in data:
        acc.feed(item)
        if first:
            first = False
            if traced:
                attempt.first_chunk(response_model=acc.model)
    if traced:
        usage = acc.usage or {}
        attempt.end(response_model=acc.model, response_id=acc.id,
                    finish_reasons=[acc.finish_reason or ""],
                    input_tokens=usage.get("prompt_tokens"),
                    output_tokens=usage.get("completion_tokens"), text=acc.content)
        reply.end()


def measure(setup: str, rounds: int, replies: int) -> dict[str, Any]:
    """In this process: µs per reply of the calls, and µs per delta of a stream with and
    without them."""
    configure(setup)
    from chatstream import telemetry
    from chatstream.conf import conf

    model = conf.get_model("mini")
    generation = SimpleNamespace(pk="g-1", conversation_id="c-1", model="mini", step=1)
    request = {"model": "gpt-mini", "max_tokens": 1024, "stream": True, "messages": MESSAGES}
    per_reply: list[float] = []
    streams: dict[tuple[int, bool], list[float]] = {(n, t): [] for n in DELTAS
                                                     for t in (False, True)}
    datas = {n: chunks(n) for n in DELTAS}
    for round_ in range(rounds):
        started = time.perf_counter()
        for _ in range(replies):
            one_reply(telemetry, model, generation, request)
        per_reply.append((time.perf_counter() - started) / replies * 1e6)
        for n in DELTAS:  # one stream of each variant in turn, each timed on its own
            totals = {False: 0.0, True: 0.0}
            count = STREAMED_DELTAS // n
            for i in range(count):
                for traced in (False, True) if (i + round_) % 2 else (True, False):
                    started = time.perf_counter()
                    stream(telemetry, model, generation, request, datas[n], traced)
                    totals[traced] += time.perf_counter() - started
            for traced, total in totals.items():
                streams[(n, traced)].append(total / count * 1e6)
    return {"per_reply": statistics.median(per_reply),
            "streams": {f"{n}/{int(t)}": statistics.median(v) for (n, t), v in streams.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--replies", type=int, default=10000)
    parser.add_argument("--setup", choices=SETUPS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.setup:  # a child: one setup, its figures as JSON
        print(json.dumps(measure(args.setup, args.rounds, args.replies)))
        return
    print(f"Python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.1f}, "
          f"median of {args.rounds} rounds")
    print("| setup | µs per reply (the calls) | " + " | ".join(
        f"stream of {n} deltas: µs without → with (difference)" for n in DELTAS) + " |")
    print("|---|---:|" + "---:|" * len(DELTAS))
    for setup, label in SETUPS.items():
        out = subprocess.run([sys.executable, __file__, "--setup", setup, "--rounds",
                              str(args.rounds), "--replies", str(args.replies)],
                             capture_output=True, text=True, check=True, cwd=ROOT)
        figures = json.loads(out.stdout)
        cells = []
        for n in DELTAS:
            without, with_ = figures["streams"][f"{n}/0"], figures["streams"][f"{n}/1"]
            cells.append(f"{without:.0f} → {with_:.0f} ({with_ - without:+.1f})")
        print(f"| {label} | {figures['per_reply']:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

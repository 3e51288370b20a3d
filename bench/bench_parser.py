"""Benchmark chatstream's SSE decoder and chunk assembler against httpx-sse 0.4.3 (+ json.loads).

Run: python bench/bench_parser.py   (needs httpx and httpx-sse installed; not a test)

Workload: 20,000 OpenAI-shaped ``chat.completion.chunk`` events (~300 bytes, multibyte text),
framed ``data: {...}\\n\\n``, concatenated and cut into 1 KiB reads as an HTTP client gets them.
Both sides are checked to produce the same events and the same assembled text before timing.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from httpx._decoders import LineDecoder, TextDecoder
from httpx_sse._decoders import SSEDecoder as HttpxSSEDecoder
from httpx_sse._decoders import SSELineDecoder

from chatstream.completions import ChatCompletionAccumulator
from chatstream.sse import SSEDecoder

EVENTS = 20_000
READ_SIZE = 1024
REPEATS = 15
WORDS = ["héllo", "wörld", "✓", "你好", "streaming", "tokens", "naïve", "café", "日本語", "ok"]


def make_stream() -> tuple[bytes, str]:
    """The framed stream and the text it assembles to."""
    parts: list[bytes] = []
    text: list[str] = []
    for i in range(EVENTS):
        piece = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(3)) + " "
        text.append(piece)
        chunk = {
            "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
            "object": "chat.completion.chunk",
            "created": 1741569952,
            "model": "gpt-4.1-2025-04-14",
            "system_fingerprint": "fp_b376dfbbd5",
            "choices": [
                {"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": None}
            ],
            "usage": None,
        }
        payload = json.dumps(chunk, ensure_ascii=False, separators=(",", ":"))
        parts.append(b"data: " + payload.encode() + b"\n\n")
    return b"".join(parts), "".join(text)


def cut(stream: bytes) -> list[bytes]:
    return [stream[i : i + READ_SIZE] for i in range(0, len(stream), READ_SIZE)]


def ours_framing(reads: list[bytes]) -> list[str]:
    decoder = SSEDecoder()
    out: list[str] = []
    for read in reads:
        for event in decoder.feed(read):
            out.append(event.data)
    for event in decoder.close():
        out.append(event.data)
    return out


def httpx_sse_framing(reads: list[bytes]) -> list[str]:
    # httpx-sse as commonly wired: httpx's text and line decoders, then its SSEDecoder per line.
    text_decoder, line_decoder, sse = TextDecoder(), LineDecoder(), HttpxSSEDecoder()
    out: list[str] = []
    for read in reads:
        for line in line_decoder.decode(text_decoder.decode(read)):
            event = sse.decode(line)
            if event is not None:
                out.append(event.data)
    for line in line_decoder.decode(text_decoder.flush()) + line_decoder.flush():
        event = sse.decode(line)
        if event is not None:
            out.append(event.data)
    return out


def httpx_sse_iter_sse_framing(reads: list[bytes]) -> list[str]:
    # What httpx-sse 0.4.3's EventSource.iter_sse runs (minus its generator layers): httpx's
    # text decoder, httpx-sse's own SSELineDecoder, rstrip("\n"), then SSEDecoder per line.
    text_decoder, line_decoder, sse = TextDecoder(), SSELineDecoder(), HttpxSSEDecoder()
    out: list[str] = []
    for read in reads:
        for line in line_decoder.decode(text_decoder.decode(read)):
            event = sse.decode(line.rstrip("\n"))
            if event is not None:
                out.append(event.data)
    for line in line_decoder.decode(text_decoder.flush()) + line_decoder.flush():
        event = sse.decode(line.rstrip("\n"))
        if event is not None:
            out.append(event.data)
    return out


def ours_full(reads: list[bytes]) -> str:
    decoder, acc = SSEDecoder(), ChatCompletionAccumulator()
    pieces: list[str] = []
    for read in reads:
        for event in decoder.feed(read):
            pieces.append(acc.feed(event.data))
    return "".join(pieces)


def httpx_sse_full(reads: list[bytes]) -> str:
    text_decoder, line_decoder, sse = TextDecoder(), LineDecoder(), HttpxSSEDecoder()
    pieces: list[str] = []
    for read in reads:
        for line in line_decoder.decode(text_decoder.decode(read)):
            event = sse.decode(line)
            if event is not None:
                chunk = json.loads(event.data)
                for choice in chunk["choices"]:
                    content = choice["delta"].get("content")
                    if content and choice["index"] == 0:
                        pieces.append(content)
    return "".join(pieces)


def best_of(fns: list[Callable[[list[bytes]], object]], reads: list[bytes]) -> list[float]:
    """Best CPU time of each function (CPU, not wall clock: other processes count less), with
    the runs interleaved so that the remaining noise hits all of them alike."""
    times = [float("inf")] * len(fns)
    for _ in range(REPEATS):
        for i, fn in enumerate(fns):
            start = time.thread_time()
            fn(reads)
            times[i] = min(times[i], time.thread_time() - start)
    return times


def main() -> None:
    stream, text = make_stream()
    reads = cut(stream)
    megabytes = len(stream) / 1e6
    print(
        f"{EVENTS} events, {len(stream) / EVENTS:.0f} B each, {megabytes:.1f} MB "
        f"in {len(reads)} reads of {READ_SIZE} B"
    )
    print(f"python {sys.version.split()[0]}, best CPU time of {REPEATS} interleaved runs")

    # Correctness first: the same events and the same assembled text on both sides.
    ours_events, theirs_events = ours_framing(reads), httpx_sse_framing(reads)
    assert len(ours_events) == len(theirs_events) == EVENTS, (len(ours_events), len(theirs_events))
    assert ours_events == theirs_events == httpx_sse_iter_sse_framing(reads)
    assert ours_full(reads) == httpx_sse_full(reads) == text

    print("\nGoals (reads of 1 KiB):")
    compare("framing", ours_framing, httpx_sse_framing, "httpx-sse", reads, megabytes)
    compare("full path", ours_full, httpx_sse_full, "httpx-sse + json.loads", reads, megabytes)
    print("\nFor reference:")
    compare(
        "framing", ours_framing, httpx_sse_iter_sse_framing, "httpx-sse iter_sse", reads, megabytes
    )
    # A server flushing every token: one event per read.
    single = [event + b"\n\n" for event in stream.split(b"\n\n")[:-1]]
    assert ours_framing(single) == theirs_events
    compare(
        "framing, 1 event/read", ours_framing, httpx_sse_framing, "httpx-sse", single, megabytes
    )
    json_libraries(stream)


def compare(
    label: str,
    ours: Callable[[list[bytes]], object],
    theirs: Callable[[list[bytes]], object],
    peer: str,
    reads: list[bytes],
    megabytes: float,
) -> None:
    t_ours, t_theirs = best_of([ours, theirs], reads)
    print(
        f"  {label:22} chatstream {megabytes / t_ours:6.1f} MB/s   "
        f"{peer} {megabytes / t_theirs:6.1f} MB/s   ratio {t_theirs / t_ours:.2f}x"
    )


def json_libraries(stream: bytes) -> None:
    """Decoding one payload (the str an SSE event carries), and the accumulator's whole feed()."""
    import msgspec

    from chatstream import completions

    payloads = [event[6:].decode() for event in stream.split(b"\n\n")[:-1]]
    decoders: dict[str, Callable[[str], object]] = {
        "json.loads": json.loads,
        "msgspec generic": msgspec.json.Decoder().decode,
        "msgspec typed (ours)": completions._decode_chunk,
    }
    try:
        import orjson

        decoders["orjson.loads"] = orjson.loads
    except ImportError:
        pass

    def run(decode: Callable[[str], object]) -> Callable[[list[bytes]], object]:
        def decode_all(_: list[bytes]) -> None:
            for payload in payloads:
                decode(payload)

        return decode_all

    def feed_all(_: list[bytes]) -> None:
        feed = ChatCompletionAccumulator().feed
        for payload in payloads:
            feed(payload)

    names = [*decoders, "accumulator feed()"]
    times = best_of([*(run(decode) for decode in decoders.values()), feed_all], [])
    print("\nPer payload (~290 B, multibyte text):")
    for name, seconds in zip(names, times, strict=True):
        print(f"  {name:22} {seconds / len(payloads) * 1e9:6.0f} ns")


if __name__ == "__main__":
    main()

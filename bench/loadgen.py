"""A lean load generator for server-sent event streams: raw asyncio Protocols, no HTTP library.

Each stream is one TCP connection carrying one request. The response is never parsed beyond its
status line: every read is timestamped with ``time.monotonic()`` (one clock for every process on
Linux, so the simulator's ``client_closed_at`` compares with it), and two byte patterns are
counted in it, with the last bytes of the previous read kept so a pattern cut by a read is still
seen once:

- ``TOKEN`` (``b" Q"``): the benchmark's replies are made of ``" Qxy"`` tokens (the simulator
  echoes a prompt of them), so each occurrence is one upstream content delta, whether it reaches
  the client one per event (the bare proxy), several per batched event (chatstream) or inside the
  provider's JSON (direct to upstream). No framing in any of the three contains it.
- ``EVENT`` (``b"event: delta"``): the events that carried them.

Tokens after ``event: done`` are not counted (chatstream's final event carries the whole reply
as HTML), nor after ``event: block`` (a finished Markdown block as HTML: the workload's replies
have no line end, so their one block is the whole reply, sent just before ``done``). The
response ends at the chunked terminator (``0\\r\\n\\r\\n``) or when the server closes.
A stream can also be closed by the client after N tokens plus a delay (a browser going away).

    python bench/loadgen.py --port 8002 --path /stream --body '{"messages": [...]}' -c 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

TOKEN = b" Q"
EVENT = b"event: delta"
FINAL = b"event: done"
BLOCK = b"event: block"
END = b"0\r\n\r\n"
_KEEP = len(EVENT) - 1  # also >= len(END)


def get(host: str, port: int, path: str, *, cookie: str = "") -> bytes:
    """A browser-like EventSource request."""
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Accept: text/event-stream",
             "Cache-Control: no-cache"]
    if cookie:
        lines.append(f"Cookie: {cookie}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def post(host: str, port: int, path: str, body: bytes, *,
         content_type: str = "application/json", headers: dict[str, str] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}", "Accept: text/event-stream"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass
class Spec:
    """One stream to open: the raw request, and whether (and when) the client walks away."""

    request: bytes
    close_after_tokens: int | None = None  # close after this many tokens have arrived ...
    close_delay: float = 0.0  # ... and this many seconds more
    tag: object = None  # the caller's key for the result (e.g. a generation id)


@dataclass
class Result:
    spec: Spec
    started: float = 0.0  # monotonic, just before connecting
    status: int = 0
    first_token: float | None = None
    arrivals: list[float] = field(default_factory=list)  # reads that carried tokens
    counts: list[int] = field(default_factory=list)  # tokens in each of those reads
    tokens: int = 0
    events: int = 0
    bytes: int = 0
    closed_by_client: float | None = None  # monotonic, just before our close()
    ended: float | None = None  # response complete, or the connection lost
    complete: bool = False  # the response ended normally (terminator seen)
    error: str = ""
    # Closes the connection now, as a browser going away (set once connected).
    close: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started

    def gaps(self) -> list[float]:
        """Seconds between successive reads that brought new tokens."""
        a = self.arrivals
        return [a[i] - a[i - 1] for i in range(1, len(a))]


class _Client(asyncio.Protocol):
    def __init__(self, result: Result, done: asyncio.Future[None]) -> None:
        self.result = result
        self.done = done
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.in_body = False
        self.tail = b""
        self.final = False
        self.close_handle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.result.close = self.close
        transport.write(self.result.spec.request)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        r = self.result
        if not self.in_body:
            self.head += data
            cut = self.head.find(b"\r\n\r\n")
            if cut < 0:
                return
            try:
                r.status = int(self.head[9:12])
            except ValueError:
                r.status = -1
            if r.status != 200:
                r.error = f"HTTP {r.status}"
                self._finish(now)
                return
            data, self.head, self.in_body = self.head[cut + 4:], b"", True
            if not data:
                return
        r.bytes += len(data)
        # Keep len(pattern) - 1 bytes of the previous read per pattern: a pattern cut by the
        # read is counted once, and none is counted twice.
        window = self.tail + data
        start = max(0, len(self.tail) - len(TOKEN) + 1)
        if self.final:
            tokens = 0
        else:
            # chatstream's final events repeat the whole reply as HTML: not deltas.
            final = min((i for i in (window.find(FINAL), window.find(BLOCK)) if i >= 0),
                        default=-1)
            if final >= 0:
                self.final = True
            tokens = window.count(TOKEN, start, final if final >= 0 else len(window))
            r.events += window.count(EVENT)
        if tokens:
            r.tokens += tokens
            r.arrivals.append(now)
            r.counts.append(tokens)
            if r.first_token is None:
                r.first_token = now
            spec = r.spec
            if (spec.close_after_tokens is not None and r.tokens >= spec.close_after_tokens
                    and self.close_handle is None and r.closed_by_client is None):
                if spec.close_delay > 0:
                    loop = asyncio.get_running_loop()
                    self.close_handle = loop.call_later(spec.close_delay, self.close)
                else:
                    self.close()
        self.tail = window[-_KEEP:]
        if window.endswith(END):
            r.complete = True
            self._finish(now)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.result.closed_by_client = time.monotonic()
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and not self.result.error:
            self.result.error = type(exc).__name__
        self._finish(time.monotonic())

    def _finish(self, now: float) -> None:
        if self.result.ended is None:
            self.result.ended = now
        if self.close_handle is not None:
            self.close_handle.cancel()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)


async def open_stream(host: str, port: int, spec: Spec, result: Result,
                      *, timeout: float) -> None:
    """Run one stream to its end, its client-side close, or ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    result.started = time.monotonic()
    transport = None
    try:
        async with asyncio.timeout(timeout):
            transport, _ = await loop.create_connection(lambda: _Client(result, done), host, port)
            await done
    except TimeoutError:
        if result.ended is None:
            result.error = result.error or "timeout"
    except OSError as exc:
        result.error = type(exc).__name__
    finally:
        if transport is not None and not transport.is_closing():
            transport.abort()
        if result.ended is None:
            result.ended = time.monotonic()


async def run(host: str, port: int, specs: Sequence[Spec], *, spread: float = 0.0,
              timeout: float = 60.0,
              on_start: Callable[[Result], None] | None = None) -> list[Result]:
    """Open every stream (start times spread evenly over ``spread`` s); wait for them all."""
    results = [Result(spec) for spec in specs]
    loop = asyncio.get_running_loop()
    begin = loop.time()
    tasks = []
    for i, (spec, result) in enumerate(zip(specs, results, strict=True)):
        if spread and len(specs) > 1:
            delay = begin + spread * i / len(specs) - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        tasks.append(loop.create_task(open_stream(host, port, spec, result, timeout=timeout)))
        if on_start is not None:
            on_start(result)
    await asyncio.gather(*tasks)
    return results


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary(results: Sequence[Result]) -> dict[str, float]:
    gaps = [g for r in results for g in r.gaps()]
    ttfts = [t for r in results if (t := r.ttft) is not None]
    return {
        "streams": len(results),
        "ok": sum(1 for r in results if r.status == 200 and not r.error),
        "tokens": sum(r.tokens for r in results),
        "events": sum(r.events for r in results),
        "ttft_p50_ms": 1000 * percentile(ttfts, 50),
        "ttft_p95_ms": 1000 * percentile(ttfts, 95),
        "gap_p50_ms": 1000 * percentile(gaps, 50),
        "gap_p99_ms": 1000 * percentile(gaps, 99),
        "gap_max_ms": 1000 * max(gaps, default=math.nan),
        "ttft_mean_ms": 1000 * statistics.fmean(ttfts) if ttfts else math.nan,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/stream")
    parser.add_argument("--body", help="POST this JSON body (else GET)")
    parser.add_argument("--cookie", default="")
    parser.add_argument("-c", "--concurrency", type=int, default=10)
    parser.add_argument("--spread", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=60.0)
    options = parser.parse_args()
    if options.body:
        request = post(options.host, options.port, options.path, options.body.encode())
    else:
        request = get(options.host, options.port, options.path, cookie=options.cookie)
    specs = [Spec(request) for _ in range(options.concurrency)]
    results = asyncio.run(run(options.host, options.port, specs, spread=options.spread,
                              timeout=options.timeout))
    print(json.dumps(summary(results), indent=2))


if __name__ == "__main__":
    main()

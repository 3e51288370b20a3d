"""What one tool step adds: a reply in two steps (two tool calls that return at once, then the
answer) through chatstream, against a user's own tool loop on the same fast upstream.

Run: ``.venv/bin/python bench/bench_tools.py [--database postgres|sqlite] [--trials 200]``
(not a test; see bench/README.md, "A tool step")

Method. The simulated upstream (``python -m chatstream.testing``) answers at once: the model
``agent?tps=0&first_token_delay=0`` asks for ``get_weather`` and ``get_time``, then, sent their
results, answers ``Results: <weather> | <time>``; the one-step reply is the echo script at the
same pace, asked to say that same answer. chatstream's model ``agent`` has the two tools of
bench/agent_tools.py (one sync, run in its tool threads; one async, run on the loop; both return
at once), ``plain`` none. Two paths, each against its peer, every trial running all eight
measurements one at a time in a new random order (the machine's noise falls on all alike):

- **HTTP**: chatstream served by one ``uvicorn --http httptools --loop uvloop`` worker
  (``project.asgi:application`` with the project's settings, its ``CHATSTREAM_MODELS`` replaced
  by the two models above): the JSON API's message POST (session cookie, CSRF header), its
  ``stream_url`` streamed, each ``event: step``'s ``stream_url`` streamed in turn, every request
  on a new connection. The peer is bare_proxy.py under the same uvicorn: ``POST /agent`` (its
  tool loop with one shared ``httpx.AsyncClient``) for two steps, ``POST /stream`` for one.
- **Python API**: in this process, under uvloop, on the same database: ``api.asend`` then
  ``api.astream`` (which follows the steps). The peer is the same loop as ``/agent``
  (bare_proxy.agent_reply) with one shared ``httpx.AsyncClient`` of this process.

Each measurement is the time from the message's POST (``asend``; the peer's request) to the
last content delta of the reply's last step. Per trial: chatstream minus the peer, for two steps
and for one; the difference of the two is what the tool step adds (its round of calls, the
next step's start, and on HTTP the next step's request). p50 and p95 over the trials.

The Python API path also gives where chatstream's time goes (when the round of calls began and
ended, from a task factory on this process's loop that times the task running
``Round.run``), and how many database queries the round runs: every Django connection has an
execute wrapper (``connection_created``), and the round's task carries a context variable that
its queries inherit, in the threads of ``sync_to_async`` too. chatstream's PostgreSQL pool
(claims, checkpoints, final saves) does not go through Django: on PostgreSQL the per-reply
totals leave those out; the round uses the ORM only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import logging
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bare_proxy
import bench_ab as ab
import bench_proxy as bp
import bench_start as bs
import httpx
import loadgen
import uvloop
from loadgen import percentile

HOST = bp.HOST
AGENT = "agent?tps=0&first_token_delay=0"  # tool calls, then "Results: ...", all at once
PLAIN = "default?tps=0&first_token_delay=0&echo"  # the user's message back, all at once
QUESTION = "Weather and time in Paris?"
ANSWER = 'Results: {"city":"Paris","sky":"clear","unit":"celsius"} | 12:00'
TOOLS = ["bench.agent_tools.get_weather", "bench.agent_tools.get_time"]
MODELS = {"agent": {"PROVIDER": "default", "MODEL": AGENT, "TOOLS": TOOLS},
          "plain": {"PROVIDER": "default", "MODEL": PLAIN}}
# A chatstream server with MODELS: project.settings as they are, but for CHATSTREAM_MODELS
# (bench_proxy.LAUNCH's way of changing a setting before Django reads it).
LAUNCH = ("import json, os, sys; import project.settings as s; "
          "s.CHATSTREAM_MODELS = json.loads(os.environ['BENCH_MODELS']); "
          "from uvicorn.main import main; sys.argv[0] = 'uvicorn'; main()")
PATHS = ("http", "api")
WHO = ("chatstream", "peer")
KINDS = tuple((path, who, steps) for path in PATHS for who in WHO for steps in (2, 1))
STEP = re.compile(rb"event: step\r?\ndata: (\{.*?\})\r?\n")
DELTA = b"event: delta"

# -- what the Python API path records: the round's time, and every query ---------------------------

PART: contextvars.ContextVar[str] = contextvars.ContextVar("bench_part", default="")
ROUNDS: list[tuple[float, float]] = []  # (started, ended) of each Round.run task, perf_counter
# While counting: (part, SQL, started, ended, thread) of each query, and of each new connection
# (SQL "connect").
queries: list[tuple[str, str, float, float, str]] | None = None


def task_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
    """Tasks as the loop makes them; the one running a round of tool calls is timed, and its
    context says ``round`` (inherited by its subtasks and its ``sync_to_async`` threads)."""
    if getattr(coro, "__qualname__", "") != "Round.run":
        return asyncio.Task(coro, loop=loop, **kwargs)
    context = (kwargs.pop("context", None) or contextvars.copy_context()).copy()
    context.run(PART.set, "round")
    task = asyncio.Task(coro, loop=loop, context=context, **kwargs)
    started = time.perf_counter()
    task.add_done_callback(lambda _: ROUNDS.append((started, time.perf_counter())))
    return task


def count_query(execute: Callable[..., Any], sql: str, params: Any, many: bool,
                context: Any) -> Any:
    if queries is None:
        return execute(sql, params, many, context)
    started = time.perf_counter()
    try:
        return execute(sql, params, many, context)
    finally:
        queries.append((PART.get(), sql, started, time.perf_counter(),
                        threading.current_thread().name))


def wrap_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    if count_query not in connection.execute_wrappers:
        connection.execute_wrappers.append(count_query)
    if queries is not None:
        now = time.perf_counter()
        queries.append((PART.get(), "connect", now, now, threading.current_thread().name))


# -- one measurement of each kind ------------------------------------------------------------------


@dataclass
class Bench:
    sim: int
    ours: int  # chatstream's port
    peer: int  # bare_proxy's port
    client: httpx.AsyncClient  # the in-process peer's
    users: bs.Users
    conversations: dict[tuple[str, int], list[tuple[Any, bs.Owner]]] = field(default_factory=dict)

    @property
    def upstream(self) -> str:
        return f"http://{HOST}:{self.sim}/v1"


async def sse(port: int, raw: bytes, *, timeout: float = 10.0) -> tuple[bytes, float | None]:
    """One streamed request on a new connection: its body, and when the last HTTP chunk that
    carried a delta arrived (each server writes whole events)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    body, last = b"", None
    try:
        async with asyncio.timeout(timeout):
            writer.write(raw)
            head = await reader.readuntil(b"\r\n\r\n")
            if head[9:12] != b"200" or b"chunked" not in head.lower():
                raise RuntimeError(f"port {port} answered {head[:200]!r}")
            while size := int((await reader.readline()).split(b";")[0], 16):
                chunk = (await reader.readexactly(size + 2))[:-2]
                if DELTA in chunk:
                    last = time.perf_counter()
                body += chunk
            await reader.readline()
    finally:
        writer.close()
    return body, last


async def http_chatstream(bench: Bench, steps: int, conversation: Any, owner: bs.Owner
                          ) -> float:
    """The JSON API's message POST, then every step's stream: to the last delta."""
    port = bench.ours
    raw = bs.message_post("api", port, conversation.pk, owner,
                          QUESTION if steps == 2 else ANSWER)
    start = time.perf_counter()
    status, answer = await bs.exchange(port, raw)
    url: str | None = bs.answered_stream_url("api", status, answer)
    last, followed = None, 0
    while url is not None:
        body, at = await sse(port, loadgen.get(HOST, port, url, cookie=owner.cookie))
        last, followed = at or last, followed + 1
        found = STEP.search(body)
        url = json.loads(found.group(1))["stream_url"] if found else None
    if last is None or followed != steps:
        raise RuntimeError(f"chatstream: {followed} step(s), no delta: see the server log")
    return last - start


async def http_peer(bench: Bench, steps: int) -> float:
    content = QUESTION if steps == 2 else ANSWER
    body = json.dumps({"messages": [{"role": "user", "content": content}]}).encode()
    raw = loadgen.post(HOST, bench.peer, "/agent" if steps == 2 else "/stream", body)
    start = time.perf_counter()
    _, last = await sse(bench.peer, raw)
    if last is None:
        raise RuntimeError("the peer sent no delta")
    return last - start


async def api_chatstream(steps: int, conversation: Any, user: Any
                         ) -> tuple[float, dict[str, float]]:
    """``api.asend``, then ``api.astream`` to the reply's last piece; and where the time went."""
    from chatstream import api

    ROUNDS.clear()
    start = time.perf_counter()
    generation = await api.asend(user, QUESTION if steps == 2 else ANSWER,
                                 conversation=conversation)
    sent, last = time.perf_counter(), None
    async with aclosing(api.astream(generation)) as pieces:
        async for piece in pieces:
            if piece:
                last = time.perf_counter()
    if last is None or len(ROUNDS) != steps - 1:
        raise RuntimeError(f"api: {len(ROUNDS)} round(s), last piece {last}")
    parts = {"send": sent - start}
    if ROUNDS:
        (began, ended), = ROUNDS
        parts |= {"step 1": began - sent, "round": ended - began, "step 2": last - ended}
    return last - start, parts


async def api_peer(bench: Bench, steps: int) -> tuple[float, dict[str, float]]:
    marks: list[float] = []
    content = QUESTION if steps == 2 else ANSWER
    start, last = time.perf_counter(), None
    async for _ in bare_proxy.agent_reply(
            bench.client, bench.upstream, AGENT if steps == 2 else PLAIN,
            [{"role": "user", "content": content}], tools=bare_proxy.TOOLS if steps == 2 else None,
            marks=marks):
        last = time.perf_counter()
    if last is None or len(marks) != 2 * steps - 1:
        raise RuntimeError(f"the peer's loop: marks {marks}, last piece {last}")
    parts: dict[str, float] = {}
    if steps == 2:
        parts = {"step 1": marks[0] - start, "tools": marks[1] - marks[0],
                 "step 2": last - marks[1]}
    return last - start, parts


async def measure(bench: Bench, kind: tuple[str, str, int], trial: int
                  ) -> tuple[float, dict[str, float]]:
    path, who, steps = kind
    if who == "peer":
        return (await http_peer(bench, steps), {}) if path == "http" else (
            await api_peer(bench, steps))
    conversation, owner = bench.conversations[(path, steps)][trial]
    if path == "http":
        return await http_chatstream(bench, steps, conversation, owner), {}
    return await api_chatstream(steps, conversation, owner.user)


def make_conversations(bench: Bench, n: int) -> None:
    """A new conversation for each of chatstream's measurements (the same history each time),
    given to the users in turn."""
    from chatstream.models import Conversation

    for path in PATHS:
        for steps in (2, 1):
            owners = bench.users.next_owners(n)
            made = Conversation.objects.bulk_create(
                [Conversation(user=o.user, model="agent" if steps == 2 else "plain")
                 for o in owners])
            bench.conversations[(path, steps)] = list(zip(made, owners, strict=True))
    bp.Fixtures.close_connection()


async def trials(bench: Bench, n: int) -> dict[str, Any]:
    make_conversations(bench, n)
    times: dict[tuple[str, str, int], list[float]] = {kind: [] for kind in KINDS}
    parts: dict[str, list[dict[str, float]]] = {who: [] for who in WHO}
    for trial in range(n):
        order = list(KINDS)
        random.shuffle(order)
        for kind in order:
            seconds, split = await measure(bench, kind, trial)
            times[kind].append(seconds)
            if split and kind[0] == "api" and kind[2] == 2:
                parts[kind[1]].append(split)
            await asyncio.sleep(0.02)
        if trial % 50 == 49:
            bp.sim_reset(bench.sim)
            bp.log(f"trial {trial + 1} of {n}")
    return {"times": {":".join(map(str, k)): v for k, v in times.items()}, "parts": parts}


async def count_queries(bench: Bench, n: int) -> dict[str, Any]:
    """The database queries of ``n`` Python API replies of each kind: the round's, and every
    one Django ran for the reply (message, streams, round), by statement."""
    global queries
    make_conversations(bench, n)
    out: dict[str, Any] = {}
    for steps in (2, 1):
        counts, rounds, spans, listing = [], [], [], []
        for trial in range(n):
            conversation, owner = bench.conversations[("api", steps)][trial]
            queries = []
            await api_chatstream(steps, conversation, owner.user)
            await asyncio.sleep(0.3)  # anything the reply left running
            got, queries = queries, None
            counts.append(sum(sql != "connect" for _, sql, *_ in got))
            mine = [q for q in got if q[0] == "round"]
            rounds.append(sum(sql != "connect" for _, sql, *_ in mine))
            if ROUNDS:
                (began, ended), = ROUNDS
                spans.append({"round": ended - began,
                              "in queries": sum(q[3] - q[2] for q in mine),
                              "connects": sum(q[1] == "connect" for q in mine),
                              "threads": len({q[4] for q in mine})} | segments(mine, began, ended))
            listing = [(part, " ".join(sql.split())[:160], t0, t1, thread)
                       for part, sql, t0, t1, thread in got]
        out[str(steps)] = {"total": counts, "round": rounds, "spans": spans, "last": listing,
                           "round_kinds": Counter(q[1].split()[0].upper() for q in listing
                                                  if q[0] == "round" and q[1] != "connect")}
    return out


SEGMENTS = {
    "record": "the calls recorded (the user, the conversation, one INSERT), to the next "
              "step's thread",
    "admit": "the next step created and admitted (a transaction), to the calls' first UPDATE",
    "calls": "the calls run (an UPDATE as each starts, one as it ends), to the last step's thread",
    "ready": "the next step's messages written (a SELECT, an UPDATE), to the round's end",
}


def segments(mine: list[tuple[str, str, float, float, str]], began: float, ended: float
             ) -> dict[str, float]:
    """The round's parts, cut where its two sync steps get their connections (``open_next``,
    ``make_ready``) and where its first call's UPDATE begins."""
    connects = [q[2] for q in mine if q[1] == "connect"]
    updates = [q[2] for q in mine if q[1].startswith('UPDATE "chatstream_toolcall"')]
    if len(connects) != 2 or not updates:
        return {}
    return {"record": connects[0] - began, "admit": updates[0] - connects[0],
            "calls": connects[1] - updates[0], "ready": ended - connects[1]}


async def warm(bench: Bench, n: int) -> None:
    make_conversations(bench, n)
    for trial in range(n):
        for kind in KINDS:
            await measure(bench, kind, trial)
    bp.sim_reset(bench.sim)


# -- the run ---------------------------------------------------------------------------------------


async def run(options: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    asyncio.get_running_loop().set_task_factory(task_factory)
    port = bp.free_port()
    sim = bp.Proc("simulator", [sys.executable, "-m", "chatstream.testing", "--port", str(port)],
                  {}, port, logdir, probe="/v1/models").start()
    procs = [sim]
    from django.conf import settings

    settings.CHATSTREAM_PROVIDERS = {"default": {"BASE_URL": f"http://{HOST}:{sim.port}/v1",
                                                 "API_KEY": "sim-demo-key"}}
    with bp.running(procs):
        ours_port = bp.free_port()
        env = {**bp.chatstream_env(sim.port, redis=False), "BENCH_MODELS": json.dumps(MODELS),
               "PYTHONPATH": str(bp.ROOT)}
        argv = [sys.executable, "-c", LAUNCH, "project.asgi:application", "--host", HOST,
                "--port", str(ours_port), "--no-access-log", "--log-level", "warning",
                "--http", "httptools", "--loop", options.loop]
        procs.append(bp.Proc("chatstream", argv, env, ours_port, logdir,
                             probe="/accounts/login/").start())
        procs.append(ab.serve(ab.PEER, "bench.bare_proxy:app",
                              {**bp.bare_env(sim.port), "BARE_MODEL": PLAIN,
                               "BARE_AGENT_MODEL": AGENT}, logdir, cwd=bp.ROOT,
                              probe="/stream", loop=options.loop))
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100,
                              keepalive_expiry=30)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(10),
                                     trust_env=False) as client:
            bench = Bench(sim.port, ours_port, procs[-1].port, client, bs.Users(options.users))
            await warm(bench, options.warm)
            got = await trials(bench, options.trials)
            got["queries"] = await count_queries(bench, options.count)
    return got


# -- the report ------------------------------------------------------------------------------------


def ms(values: list[float]) -> str:
    return f"{1000 * percentile(values, 50):.1f} / {1000 * percentile(values, 95):.1f}"


def report(got: dict[str, Any], setup: str) -> str:
    t = {tuple(k.split(":")): v for k, v in got["times"].items()}

    def of(path: str, who: str, steps: int) -> list[float]:
        return t[(path, who, str(steps))]

    def minus(a: list[float], b: list[float]) -> list[float]:
        return [x - y for x, y in zip(a, b, strict=True)]

    lines = [setup, "", "| ms, p50 / p95 | HTTP (JSON API) | Python API (in process) |",
             "| --- | --- | --- |"]
    def ratio(p: str) -> str:
        ours, peer = of(p, "chatstream", 2), of(p, "peer", 2)
        return f" ({statistics.median(ours) / statistics.median(peer):.2f}×)"

    rows: list[tuple[str, Callable[[str], str]]] = [
        ("peer, two steps: request → last delta", lambda p: ms(of(p, "peer", 2))),
        ("chatstream, two steps: message POST → last delta",
         lambda p: ms(of(p, "chatstream", 2)) + ratio(p)),
        ("chatstream − peer, two steps", lambda p: ms(minus(of(p, "chatstream", 2),
                                                             of(p, "peer", 2)))),
        ("chatstream − peer, one step (no tools)", lambda p: ms(minus(of(p, "chatstream", 1),
                                                                       of(p, "peer", 1)))),
        ("**what the tool step adds** (two-step − one-step difference)", lambda p: ms(minus(
            minus(of(p, "chatstream", 2), of(p, "peer", 2)),
            minus(of(p, "chatstream", 1), of(p, "peer", 1))))),
    ]
    for title, cell in rows:
        lines.append(f"| {title} | {cell('http')} | {cell('api')} |")
    parts = got["parts"]
    lines += ["", "Where the Python API path's two-step time goes (ms, p50 / p95):", "",
              "| part | chatstream | peer |", "| --- | --- | --- |"]
    for part, peer_part in (("send", None), ("step 1", "step 1"), ("round", "tools"),
                            ("step 2", "step 2")):
        ours = ms([p[part] for p in parts["chatstream"]])
        peer = ms([p[peer_part] for p in parts["peer"]]) if peer_part else "—"
        title = {"send": "the message stored (`asend`)",
                 "step 1": "step 1: to its end (chatstream: its round's start)",
                 "round": "the round of calls (peer: calling the two functions)",
                 "step 2": "step 2: to its last delta (chatstream: from the round's end)"}[part]
        lines.append(f"| {title} | {ours} | {peer} |")
    q = got["queries"]
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(q["2"]["round_kinds"].items()))
    lines += ["", f"Database queries (Python API, {len(q['2']['total'])} replies each): the round "
              f"of calls {'/'.join(map(str, sorted(set(q['2']['round']))))} ({kinds}); "
              f"everything Django ran per reply, two steps "
              f"{'/'.join(map(str, sorted(set(q['2']['total']))))}, one step "
              f"{'/'.join(map(str, sorted(set(q['1']['total']))))}."]
    spans = q["2"]["spans"]
    lines += ["", "The round in those replies (median): "
              f"{1000 * statistics.median(s['round'] for s in spans):.1f} ms, of which "
              f"{1000 * statistics.median(s['in queries'] for s in spans):.1f} ms inside its "
              f"queries (Django's cursor to the driver's answer); "
              f"{statistics.median(s['connects'] for s in spans):g} new Django connections, "
              f"{statistics.median(s['threads'] for s in spans):g} threads. Its parts, each "
              "from its first query (or the round's start) to the next part's:", ""]
    for key, title in SEGMENTS.items():
        values = [s[key] for s in spans if key in s]
        if values:
            lines.append(f"- {title}: {1000 * statistics.median(values):.1f} ms")
    return "\n".join(lines) + "\n"


def main() -> None:
    global queries
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--database", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--warm", type=int, default=5, help="trials before the measured ones")
    parser.add_argument("--count", type=int, default=20,
                        help="replies of each kind whose queries are counted")
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--out", type=Path, help="the JSON file (default: in the log directory)")
    options = parser.parse_args()
    logdir = Path(tempfile.mkdtemp(prefix="bench-tools-"))
    started, load0 = time.monotonic(), os.getloadavg()[0]
    bp.log(f"logs in {logdir}; {options}")
    try:
        bs.prepare_database(options.database, logdir, {})
        from django.conf import settings
        from django.db.backends.signals import connection_created

        settings.CHATSTREAM_MODELS = MODELS
        connection_created.connect(wrap_connection)
        for handler in logging.getLogger("chatstream").handlers:  # as the servers': to a file
            if isinstance(handler, logging.StreamHandler):
                handler.setStream((logdir / "in-process.log").open("a"))
        runner: Callable[[Coroutine[Any, Any, dict[str, Any]]], dict[str, Any]] = (
            uvloop.run if options.loop == "uvloop" else asyncio.run)
        got = runner(run(options, logdir))
    finally:
        if options.database == "postgres":
            bp.drop_database()
    setup = (f"{time.strftime('%Y-%m-%d %H:%M')}, {options.database}, {options.loop} (uvicorn "
             f"--http httptools, 1 worker each; this process for the Python API), "
             f"{options.trials} trials, load average {load0:.2f} → {os.getloadavg()[0]:.2f}, "
             f"{os.cpu_count()} cores shared, {time.monotonic() - started:.0f} s; chatstream "
             f"{bs.describe('.')}")
    table = report(got, setup)
    print()
    print(table)
    listing = got["queries"]["2"]["last"]
    for part, sql, t0, t1, thread in listing:
        print(f"  {1000 * (t0 - listing[0][2]):7.2f} {1000 * (t1 - t0):5.2f} {part or '-':6} "
              f"{thread[:24]:24} {sql[:90]}")
    out = options.out or logdir / "bench_tools.json"
    out.write_text(json.dumps({"setup": setup, "options": vars(options), **got, "table": table},
                              indent=1, default=str))
    bp.log(f"written to {out}")


if __name__ == "__main__":
    main()

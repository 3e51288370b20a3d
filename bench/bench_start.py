"""Every way a chatstream stream starts, measured against the peer, variant by variant.

Run: ``.venv/bin/python bench/bench_start.py --variant now=. [--database postgres|sqlite]
[--loop uvloop|asyncio] [--env NAME=VALUE] [--quick]``   (not a test; see bench/README.md,
"Every way a stream starts")

Method. Each variant is a git commit (``--variant name=ref``, ``.`` the working tree) checked
out in its own worktree (bench_ab.py) and served by its own uvicorn worker (``--http
httptools``, ``--loop uvloop`` or ``asyncio``, ``project.asgi:application`` with the project's
settings as they are), beside the peer (bare_proxy.py) and the simulated upstream
(paced_simulator.py: the echo script, its pace set between phases: every chunk at once, the
fast upstream, for figures 1 to 3; 20 deltas a second for 4 to 6). ``--env NAME=VALUE`` passes
a setting the project reads from the environment (SQLITE_SYNCHRONOUS, CONN_MAX_AGE,
DATABASE_POOL_SIZE...) to every variant, ``--env name:NAME=VALUE`` to one. The database is a
fresh PostgreSQL database or a fresh SQLite file, migrated; ``--users`` users (600) each have
a database session of their own (django.contrib.sessions' db backend, as the project uses),
and the streams are spread over them in turn. The pending generations a stream starts are made
with the ORM as the message POST stores them (bench_proxy.pending_generations), except in
figures 2 and 3, where the POST makes them. Every round measures every variant and the peer,
in a new random order each time, so the machine's noise falls on all alike; a figure is the
rounds' values and the median of the rounds' ratios to the peer. The start paths:

- **ticket**: ``GET /chat/g/<id>/stream/?ticket=...`` (the page's EventSource URL; served in
  front of Django by chatstream.asgi.with_fast_streams);
- **no ticket**: the same URL without the ticket (a page reconnecting before any text came),
  authenticated by the session through Django's request cycle;
- **expired ticket**: a ticket older than CHATSTREAM_STREAM_TICKET_MAX_AGE: the session again;
- **api**: the JSON API's ``GET /chat/api/generations/<id>/stream/`` (session cookie).

Figures:

1. TTFT from the stream's GET, one stream at a time, every path of every variant, the peer's
   ``POST /stream`` and the direct call in each trial, in random order; each one's time to
   first delta minus the direct call's in the same trial, p50 and p95.
2. TTFT from the message's POST, one at a time: the page's htmx POST (as the composer sends it:
   its form with the CSRF token, the session and CSRF cookies, htmx's headers), the stream URL
   with its ticket read from the answer's ``sse-connect``, then its GET to the first delta; the
   same for a later message (a conversation with one exchange before it: the history is read);
   the same through the JSON API (its POST answers the stream URL). Three times per trial: the
   POST answered, the GET to its first delta, the POST's start to the first delta. The peer's:
   its ``POST /stream`` to the first delta. And Django's floor: the page's POST answered by a
   view that stores the message and nothing else (bench/django_floor.py), on a worker with the
   project's settings and middleware, the same database and sessions.
3. Database rows written per reply, POST and stream, split by table (PostgreSQL only, first
   round: a trigger counts every row written, bench_proxy.counting_writes).
4. Capacity: C streams started over 1 s, each from its own user's session, by the ticket path
   (and ``--capacity-paths``); a step passes when every stream completes, TTFT p95 <= 1 s and
   the p99 gap between reads <= 100 ms (bench_proxy.Step). Each path stops at its first failure.
5. CPU per 1,000 deltas at the largest step the path and the peer both passed (else the first
   step); memory per open stream: RSS with ``--memory`` streams open minus at rest, first
   round only, on fresh workers.
6. Upstream closed after a mass disconnect: ``--close-streams`` streams open, then every
   client closes its socket at once; the simulator's ``client_closed_at`` minus each close.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import html
import json
import math
import os
import random
import re
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlencode

import bench_ab as ab
import bench_proxy as bp
import loadgen
from loadgen import Result, Spec, percentile

ROOT, HOST, PEER = bp.ROOT, bp.HOST, ab.PEER
SCENARIO = "bench"  # paced_simulator.py's scenario: the model of every server
FAST, PACED = 0, bp.TPS  # the upstream's pace: every chunk at once; 20 deltas/s
PATHS = ("ticket", "noticket", "expired", "api")
# The reply of figures 1 and 2: 50 chunks, which the fast upstream sends at once (one network
# read holds them all: what is decoded before the first delta is sent counts).
REPLY = 50
TITLES = {"ticket": "ticket", "noticket": "no ticket", "expired": "expired ticket",
          "api": "JSON API", "page": "page (htmx POST)",
          "later": "page, a later message (one exchange before it)"}
POSTS = ("page", "later", "api")
TTFT_LIMIT_MS = 1000.0
TABLES = ("chatstream_%", "django_session", "auth_user")  # whose writes figure 3 counts
FLOOR = "floor"  # Django's floor for the page's POST: bench/django_floor.py


@dataclass
class Plan:
    """How much of everything a run does (full, or --quick)."""

    rounds: int = 3
    ttft_trials: int = 100
    write_replies: int = 20
    steps: tuple[int, ...] = (100, 200, 300, 400, 500, 600)
    step_tokens: int = 200  # 10 s at 20 deltas/s
    capacity_paths: tuple[str, ...] = ("ticket",)
    memory_streams: int = 200
    close_streams: int = 50


QUICK = Plan(rounds=1, ttft_trials=20, write_replies=5, steps=(50, 100), step_tokens=100,
             memory_streams=50)


def label(name: str, path: str) -> str:
    return f"{name}:{path}"


# -- users, sessions, pending generations ---------------------------------------------------------


@dataclass(frozen=True)
class Owner:
    """A signed-in user: their database session, CSRF secret and the browser's cookies."""

    user: Any
    session_key: str
    csrf: str
    cookie: str


@dataclass(frozen=True)
class Pending:
    pk: uuid.UUID
    marker: str
    owner: Owner


class Users:
    """``n`` users, each with a database session of its own; streams are given them in turn."""

    def __init__(self, n: int) -> None:
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from django.contrib.auth.hashers import make_password
        from django.contrib.sessions.backends.db import SessionStore
        from django.contrib.sessions.models import Session
        from django.utils import timezone

        user_model = get_user_model()
        prefix = f"bench-{secrets.token_hex(3)}-"
        password = make_password("bench-only")  # hashed once: the same for every user
        user_model.objects.bulk_create(
            [user_model(username=f"{prefix}{i:04d}", password=password) for i in range(n)])
        users = list(user_model.objects.filter(username__startswith=prefix).order_by("username"))
        expire = timezone.now() + timedelta(seconds=settings.SESSION_COOKIE_AGE)
        store, sessions, self.owners = SessionStore(), [], []
        for user in users:
            key, csrf = secrets.token_hex(16), secrets.token_hex(16)  # Django takes the secret
            data = {"_auth_user_id": str(user.pk), "_auth_user_hash": user.get_session_auth_hash(),
                    "_auth_user_backend": "django.contrib.auth.backends.ModelBackend"}
            sessions.append(Session(session_key=key, session_data=store.encode(data),
                                    expire_date=expire))
            cookie = f"{settings.SESSION_COOKIE_NAME}={key}; {settings.CSRF_COOKIE_NAME}={csrf}"
            self.owners.append(Owner(user, key, csrf, cookie))
        Session.objects.bulk_create(sessions)
        self.turn = self.count = 0
        bp.Fixtures.close_connection()

    def next_marker(self) -> str:
        self.count += 1
        return f"{self.count:06d}"

    def next_owners(self, n: int) -> list[Owner]:
        out = [self.owners[(self.turn + i) % len(self.owners)] for i in range(n)]
        self.turn = (self.turn + n) % len(self.owners)
        return out

    def pending(self, n: int, tokens: int) -> list[Pending]:
        owners = self.next_owners(n)
        made = bp.pending_generations([o.user for o in owners], tokens, self.next_marker)
        bp.Fixtures.close_connection()
        return [Pending(g.pk, marker, o) for (g, marker), o in zip(made, owners, strict=True)]

    def conversations(self, n: int, kind: str = "page") -> list[tuple[uuid.UUID, Owner]]:
        """``n`` conversations, each of its own user: empty, or for ``later`` with one
        exchange (a question and its reply) before the message the bench posts."""
        from chatstream.models import Conversation, Generation, Message

        owners = self.next_owners(n)
        made = Conversation.objects.bulk_create(
            [Conversation(user=o.user, model=bp.MODEL, title="bench" if kind == "later" else "")
             for o in owners])
        if kind == "later":
            asked = Message.objects.bulk_create(
                [Message(conversation=c, role=Message.Role.USER, content=bp.prompt(20, "earlier"))
                 for c in made])
            replies = Generation.objects.bulk_create(
                [Generation(conversation=c, user=o.user, prompt_message=m, model=bp.MODEL,
                            status=Generation.Status.COMPLETED, content="An earlier reply.")
                 for c, o, m in zip(made, owners, asked, strict=True)])
            Message.objects.bulk_create(
                [Message(conversation=c, role=Message.Role.ASSISTANT, content=g.content,
                         generation=g) for c, g in zip(made, replies, strict=True)])
        bp.Fixtures.close_connection()
        return [(c.pk, o) for c, o in zip(made, owners, strict=True)]


# -- the requests of each path --------------------------------------------------------------------


def expired_ticket(g: Pending) -> str:
    """A ticket for ``g`` signed long enough ago to be refused as expired."""
    from django.core import signing

    from chatstream.conf import conf
    from chatstream.stream import issue_ticket

    signed_at = signing.b62_encode(int(time.time() - conf.STREAM_TICKET_MAX_AGE - 60))
    with mock.patch.object(signing.TimestampSigner, "timestamp", lambda self: signed_at):
        return issue_ticket(g.pk, g.owner.user.pk, g.owner.session_key)


def stream_url(g: Pending, path: str) -> str:
    """The URL a client of ``path`` opens for ``g`` (a ticket is signed now, as the page's)."""
    from django.urls import reverse

    from chatstream.stream import TICKET_PARAMETER, issue_ticket

    if path == "api":
        return reverse("chatstream:api-generation-stream", args=[g.pk])
    url = reverse("chatstream:generation-stream", args=[g.pk])
    if path == "noticket":
        return url
    ticket = (issue_ticket(g.pk, g.owner.user.pk, g.owner.session_key) if path == "ticket"
              else expired_ticket(g))
    return f"{url}?{urlencode({TICKET_PARAMETER: ticket})}"


def stream_spec(port: int, g: Pending, path: str, **close: Any) -> Spec:
    return Spec(loadgen.get(HOST, port, stream_url(g, path), cookie=g.owner.cookie),
                tag=(g.pk, g.marker), **close)


def request(method: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def message_post(kind: str, port: int, conversation: uuid.UUID, owner: Owner,
                 content: str) -> bytes:
    """The message POST as the page's composer sends it (htmx), or as an API client does."""
    from django.urls import reverse

    origin = f"http://{HOST}:{port}"
    if kind == "api":
        return request("POST", port, reverse("chatstream:api-messages", args=[conversation]),
                       json.dumps({"content": content}).encode(),
                       {"Content-Type": "application/json", "Accept": "application/json",
                        "X-CSRFToken": owner.csrf, "Origin": origin, "Cookie": owner.cookie})
    # The composer's form: its {% csrf_token %} and the textarea (one model: no select).
    page = origin + reverse("chatstream:conversation-detail", args=[conversation])
    body = urlencode({"csrfmiddlewaretoken": owner.csrf, "content": content}).encode()
    return request("POST", port, reverse("chatstream:message-create", args=[conversation]), body,
                   {"Content-Type": "application/x-www-form-urlencoded", "Accept": "*/*",
                    "HX-Request": "true", "HX-Current-URL": page, "HX-Target": "cs-transcript",
                    "HX-Trigger": "cs-composer", "Origin": origin, "Referer": page,
                    "Cookie": owner.cookie})


SSE_CONNECT = re.compile(r'sse-connect="(/[^"]*/stream/[^"]*)"')


def answered_stream_url(kind: str, status: int, body: bytes) -> str:
    """The stream URL in the POST's answer: the API's ``stream_url``; the page's EventSource
    URL, ticket included (``sse-connect``: ``data-stream`` is the same URL without it, what
    chatstream.js reconnects to)."""
    if kind == "api" and status == 201:
        return str(json.loads(body)["stream_url"])
    if kind != "api" and status == 200 and (found := SSE_CONNECT.search(body.decode())):
        return html.unescape(found.group(1))
    raise RuntimeError(f"{kind} message POST answered {status}: {body[:300]!r}")


async def exchange(port: int, raw: bytes, *, timeout: float = 10.0) -> tuple[int, bytes]:
    """One request on a new connection: the answer's status and whole body."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        async with asyncio.timeout(timeout):
            writer.write(raw)
            head = await reader.readuntil(b"\r\n\r\n")
            fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
            headers = {k.strip().lower(): v.strip().lower() for k, v in fields.items()}
            if b"content-length" in headers:
                body = await reader.readexactly(int(headers[b"content-length"]))
            elif headers.get(b"transfer-encoding") == b"chunked":
                body = b""
                while size := int((await reader.readline()).split(b";")[0], 16):
                    body += (await reader.readexactly(size + 2))[:-2]
                await reader.readline()
            else:
                body = await reader.read()
    finally:
        writer.close()
    return int(head[9:12]), body


# -- the servers ----------------------------------------------------------------------------------


@dataclass
class Bench:
    sim: int
    servers: dict[str, bp.Proc]  # the variants' workers, then the peer's
    users: Users
    paths: bp.Paths  # direct and peer requests
    variants: list[str]
    floor: bp.Proc  # the project's settings, the page's POST answered by django_floor.py

    def port(self, name: str) -> int:
        return self.servers[name].port

    def shuffled(self) -> list[str]:
        names = list(self.servers)
        random.shuffle(names)
        return names

    def settle(self, name: str) -> None:
        """After a load: the worker idle again (final saves done), the simulator's log empty."""
        self.servers[name].wait_idle()
        bp.sim_reset(self.sim)


def set_pace(sim: int, tps: float) -> None:
    import httpx

    httpx.post(f"http://{HOST}:{sim}/_bench/pace", params={"tps": tps}, timeout=10)


async def first_delta(port: int, spec: Spec, what: str) -> Result:
    [result] = await loadgen.run(HOST, port, [spec], timeout=10)
    if result.first_token is None:
        raise RuntimeError(f"{what} gave no delta: {result.error or result.status}")
    return result


async def post_then_stream(bench: Bench, name: str, kind: str, conversation: uuid.UUID,
                           owner: Owner) -> tuple[float, float, float]:
    """The message POST, then its stream: (POST answered, GET to first delta, POST to first
    delta), in seconds."""
    port = bench.port(name)
    content = bp.prompt(REPLY, bench.users.next_marker())
    raw = message_post(kind, port, conversation, owner, content)
    t0 = time.monotonic()
    status, body = await exchange(port, raw)
    t1 = time.monotonic()
    url = answered_stream_url(kind, status, body)
    spec = Spec(loadgen.get(HOST, port, url, cookie=owner.cookie))
    result = await first_delta(port, spec, f"{name} {kind} stream")
    assert result.first_token is not None
    return t1 - t0, result.first_token - result.started, result.first_token - t0


async def floor_post(bench: Bench, conversation: uuid.UUID, owner: Owner) -> float:
    """The page's POST answered by Django's floor: seconds."""
    port = bench.floor.port
    raw = message_post("page", port, conversation, owner, bp.prompt(REPLY, "floor"))
    t0 = time.monotonic()
    status, body = await exchange(port, raw)
    if status != 200:
        raise RuntimeError(f"the floor's POST answered {status}: {body[:300]!r}")
    return time.monotonic() - t0


async def warm(bench: Bench) -> None:
    """A few streams of every path through every server, and a few POSTs (imports, pools)."""
    for name in bench.servers:
        port = bench.port(name)
        if name == PEER:
            specs = [bench.paths.bare(port, 5) for _ in range(20)]
        else:
            specs = [stream_spec(port, g, PATHS[i % len(PATHS)])
                     for i, g in enumerate(bench.users.pending(20, 5))]
        results = await loadgen.run(HOST, port, specs, spread=0.5, timeout=20)
        if failed := [r.error or r.status for r in results if r.error or not r.complete]:
            raise RuntimeError(f"warm-up of {name} failed: {failed[:3]} (see the server log)")
        if name != PEER:
            for kind in POSTS:
                for conversation, owner in bench.users.conversations(3, kind):
                    await post_then_stream(bench, name, kind, conversation, owner)
        bench.settle(name)
    for conversation, owner in bench.users.conversations(5):
        await floor_post(bench, conversation, owner)


# -- the figures ----------------------------------------------------------------------------------


def ms(values: Sequence[float]) -> dict[str, float]:
    return {"p50": 1000 * percentile(values, 50), "p95": 1000 * percentile(values, 95),
            "p99": 1000 * percentile(values, 99)}


async def ttft_from_get(bench: Bench, trials: int) -> dict[str, dict[str, float]]:
    """Figure 1: every start path's TTFT from its GET, minus the direct call's, per trial."""
    keys = [(name, path) for name in bench.variants for path in PATHS]
    pending = {key: bench.users.pending(trials, REPLY) for key in keys}
    added: dict[str, list[float]] = {label(*key): [] for key in keys} | {PEER: [], "direct": []}
    for i in range(trials):
        order: list[Any] = ["direct", PEER, *keys]
        random.shuffle(order)
        got: dict[str, float] = {}
        for key in order:
            if key == "direct":
                port, spec = bench.sim, bench.paths.direct(REPLY)
            elif key == PEER:
                port = bench.port(PEER)
                spec = bench.paths.bare(port, REPLY)
            else:
                port = bench.port(key[0])
                spec = stream_spec(port, pending[key][i], key[1])
            result = await first_delta(port, spec, str(key))
            got[key if isinstance(key, str) else label(*key)] = result.ttft or math.nan
            await asyncio.sleep(0.02)
        for name, values in added.items():
            values.append(got[name] if name == "direct" else got[name] - got["direct"])
    out = {name: ms(values) for name, values in added.items()}
    bp.log("TTFT from the GET, added p50 (ms): " + ", ".join(
        f"{name} {v['p50']:.1f}" for name, v in out.items()))
    return out


async def ttft_from_post(bench: Bench, trials: int) -> dict[str, dict[str, dict[str, float]]]:
    """Figure 2: the message's POST, then its stream's first delta (absolute times)."""
    keys = [(name, kind) for name in bench.variants for kind in POSTS]
    conversations = {key: bench.users.conversations(trials, key[1] if key != FLOOR else "page")
                     for key in [*keys, FLOOR]}
    times: dict[str, dict[str, list[float]]] = {
        label(*key): {"post": [], "get": [], "total": []} for key in keys}
    times |= {PEER: {"total": []}, "direct": {"total": []}, FLOOR: {"post": []}}
    for i in range(trials):
        order: list[Any] = ["direct", PEER, FLOOR, *keys]
        random.shuffle(order)
        for key in order:
            if key == FLOOR:
                times[key]["post"].append(await floor_post(bench, *conversations[key][i]))
            elif key == "direct":
                result = await first_delta(bench.sim, bench.paths.direct(REPLY), key)
                times[key]["total"].append(result.ttft or math.nan)
            elif key == PEER:
                port = bench.port(PEER)
                result = await first_delta(port, bench.paths.bare(port, REPLY), key)
                times[key]["total"].append(result.ttft or math.nan)
            else:
                got = await post_then_stream(bench, *key, *conversations[key][i])
                for what, seconds in zip(("post", "get", "total"), got, strict=True):
                    times[label(*key)][what].append(seconds)
            await asyncio.sleep(0.02)
    out = {name: {what: ms(values) for what, values in kinds.items()}
           for name, kinds in times.items()}
    bp.log("TTFT from the POST, p50 (ms): " + ", ".join(
        f"{name} {v['total']['p50']:.1f}" for name, v in out.items() if "total" in v)
        + f"; Django's floor, POST answered {out[FLOOR]['post']['p50']:.1f}")
    return out


async def writes_of(bench: Bench, name: str, kind: str, n: int) -> dict[str, dict[str, float]]:
    """Rows written per reply by ``kind``'s message POST, then by its stream, per table."""
    port = bench.port(name)
    conversations = bench.users.conversations(n, kind)
    bench.servers[name].wait_idle()
    before = bp.table_writes()
    urls = []
    for conversation, owner in conversations:
        content = bp.prompt(20, bench.users.next_marker())
        status, body = await exchange(port, message_post(kind, port, conversation, owner, content))
        urls.append((answered_stream_url(kind, status, body), owner))
    posted = bp.table_writes()
    for url, owner in urls:
        [result] = await loadgen.run(HOST, port, [Spec(loadgen.get(HOST, port, url,
                                                                   cookie=owner.cookie))],
                                     timeout=30)
        if not result.complete:
            raise RuntimeError(f"{name} {kind} stream failed: {result.error or result.status}")
    bench.settle(name)
    after = bp.table_writes()
    return {"post": {t: v / n for t, v in bp.diff(posted, before).items()},
            "stream": {t: v / n for t, v in bp.diff(after, posted).items()}}


async def db_writes(bench: Bench, n: int) -> dict[str, dict[str, dict[str, float]]]:
    """Figure 3 (PostgreSQL): rows written per reply, POST and stream, by table."""
    out = {}
    with bp.counting_writes(TABLES):
        for name in random.sample(bench.variants, len(bench.variants)):
            for kind in POSTS:
                out[label(name, kind)] = got = await writes_of(bench, name, kind, n)
                bp.log(f"{name} {kind}: rows per reply, POST {got['post']}, stream "
                       f"{got['stream']}")
    return {label(name, kind): out[label(name, kind)] for name in bench.variants
            for kind in POSTS}


async def capacity(bench: Bench, plan: Plan) -> dict[str, list[dict[str, Any]]]:
    """Figure 4: each path stepped up until its first failure (TTFT p95 counts)."""
    entries = [(name, path) for name in bench.variants for path in plan.capacity_paths]
    steps: dict[str, list[dict[str, Any]]] = {label(*e): [] for e in entries} | {PEER: []}
    failed: set[str] = set()
    for c in plan.steps:
        live: list[Any] = [e for e in [*entries, PEER]
                           if (e if e == PEER else label(*e)) not in failed]
        random.shuffle(live)
        for entry in live:
            name, path = (PEER, "") if entry == PEER else entry
            key = PEER if entry == PEER else label(name, path)
            port = bench.port(name)
            specs = ([bench.paths.bare(port, plan.step_tokens) for _ in range(c)] if name == PEER
                     else [stream_spec(port, g, path)
                           for g in bench.users.pending(c, plan.step_tokens)])
            step = await bp.load_step(key, port, specs, bench.servers[name],
                                      timeout=plan.step_tokens / bp.TPS + 30,
                                      ttft_limit_ms=TTFT_LIMIT_MS)
            bench.settle(name)
            s = step.summary
            steps[key].append({
                "c": c, "passed": step.passed, "complete": step.complete,
                "ttft_p95_ms": s["ttft_p95_ms"], "gap_p99_ms": s["gap_p99_ms"],
                "cpu_per_1000": step.cpu_per_1000, "errors": sorted(set(step.errors))[:3]})
            if not step.passed:
                failed.add(key)
    return steps


async def memory(bench: Bench, n: int) -> dict[str, float]:
    """Figure 5b: RSS per open stream (ticket path), on workers that carried no load yet."""
    out = {}
    for name in bench.shuffled():
        proc, port = bench.servers[name], bench.port(name)
        proc.wait_idle()  # first: the tickets are signed next, and last 10 s
        specs = ([bench.paths.bare(port, 600) for _ in range(n)] if name == PEER
                 else [stream_spec(port, g, "ticket") for g in bench.users.pending(n, 600)])
        out[name] = (await bp.memory(name, proc, port, specs, db=False))["per_kb"]
        bench.settle(name)
    return out


async def mass_close_of(bench: Bench, name: str, n: int) -> dict[str, float]:
    """``n`` streams open, then every client closes at once: each close to the upstream's."""
    port = bench.port(name)
    bp.sim_reset(bench.sim)
    specs = ([bench.paths.bare(port, 600) for _ in range(n)] if name == PEER
             else [stream_spec(port, g, "ticket") for g in bench.users.pending(n, 600)])
    results: list[Result] = []
    runner = asyncio.create_task(loadgen.run(HOST, port, specs, spread=0.5, timeout=60,
                                             on_start=results.append))
    for _ in range(300):  # every stream streaming (or 15 s)
        if len(results) == n and all(r.first_token is not None for r in results):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    closed = [r for r in results if r.ended is None and r.close is not None]
    for result in closed:
        result.close()  # type: ignore[misc]
    await runner
    await asyncio.sleep(1.0)
    upstream = bp.closed_at_by_marker(bench.sim)
    lat = [at - r.closed_by_client for r in closed
           if r.closed_by_client is not None
           and (at := upstream.get(bp.marker_of(r.spec))) is not None]
    got = {**ms(lat), "max": 1000 * max(lat, default=math.nan), "seen": len(lat),
           "closed": len(closed)}
    bp.log(f"{name:>10} mass disconnect of {len(closed)}: upstream closed p50 {got['p50']:.1f} "
           f"ms, p99 {got['p99']:.1f} ms ({len(lat)} seen)")
    return got


async def one_round(bench: Bench, plan: Plan, number: int, *, count_writes: bool
                    ) -> dict[str, Any]:
    got: dict[str, Any] = {}
    if number == 1 and plan.memory_streams:  # RSS only grows: fresh workers only
        set_pace(bench.sim, PACED)
        got["memory"] = await memory(bench, plan.memory_streams)
    set_pace(bench.sim, FAST)
    got["ttft_get"] = await ttft_from_get(bench, plan.ttft_trials)
    got["ttft_post"] = await ttft_from_post(bench, plan.ttft_trials)
    if number == 1 and count_writes and plan.write_replies:
        got["writes"] = await db_writes(bench, plan.write_replies)
    set_pace(bench.sim, PACED)
    got["capacity"] = await capacity(bench, plan)
    if plan.close_streams:
        got["close"] = {name: await mass_close_of(bench, name, plan.close_streams)
                        for name in bench.shuffled()}
        for name in bench.servers:
            bench.settle(name)
    return got


async def run(options: argparse.Namespace, plan: Plan, variants: dict[str, tuple[Path, dict]],
              logdir: Path) -> list[dict[str, Any]]:
    port = bp.free_port()
    sim = bp.Proc("simulator", [sys.executable, str(ROOT / "bench" / "paced_simulator.py"),
                                "--port", str(port)], {}, port, logdir,
                  probe="/v1/models").start()
    procs = [sim]
    rounds: list[dict[str, Any]] = []
    with bp.running(procs):
        users = Users(options.users)
        servers: dict[str, bp.Proc] = {}
        for name, (tree, env) in variants.items():
            servers[name] = ab.serve(name, "project.asgi:application",
                                     {**bp.chatstream_env(sim.port, redis=False), **env}, logdir,
                                     cwd=tree, probe="/accounts/login/", loop=options.loop)
            procs.append(servers[name])
        servers[PEER] = ab.serve(PEER, "bench.bare_proxy:app", bp.bare_env(sim.port), logdir,
                                 cwd=ROOT, probe="/stream", loop=options.loop)
        procs.append(servers[PEER])
        common, _envs = environments(options, list(variants))
        floor = ab.serve(FLOOR, "project.asgi:application",
                         {**bp.chatstream_env(sim.port, redis=False), **common,
                          "DJANGO_SETTINGS_MODULE": "bench.floor_settings"}, logdir,
                         cwd=ROOT, probe="/accounts/login/", loop=options.loop)
        procs.append(floor)
        bench = Bench(sim.port, servers, users, bp.Paths(sim.port, users), list(variants),
                      floor)
        set_pace(sim.port, FAST)
        await warm(bench)
        for number in range(1, plan.rounds + 1):
            bp.log(f"== round {number} of {plan.rounds}")
            rounds.append(await one_round(bench, plan, number,
                                          count_writes=options.database == "postgres"))
            bp.log(json.dumps(rounds[-1], default=str)[:2000])
    return rounds


# -- the report -----------------------------------------------------------------------------------


Getter = Callable[[dict[str, Any], str], float | None]


def fmt(value: float | None, digits: int) -> str:
    if value is None or math.isnan(value):
        return "—"
    return f"{value:,.{digits}f}"


def cell(rounds: list[dict[str, Any]], column: str, value: Getter, against: Getter,
         digits: int) -> str:
    """The rounds' values, then the median of their ratios to ``against`` (the peer's)."""
    values = [value(r, column) for r in rounds]
    if all(v is None for v in values):
        return "—"
    shown = " / ".join(fmt(v, digits) for v in values)
    if column == PEER:
        return shown
    ratios = [v / p for r, v in zip(rounds, values, strict=True)
              if v is not None and (p := against(r, column)) and not math.isnan(p + v)]
    return f"{shown} ({statistics.median(ratios):.2f}×)" if ratios else shown


def capacity_of(steps: list[dict[str, Any]]) -> float:
    """The largest step passed before the first failure (0: none)."""
    best = 0
    for step in steps:
        if not step["passed"]:
            break
        best = step["c"]
    return best


def cpu_step(r: dict[str, Any], key: str) -> int | None:
    """The step at which figure 5's CPU is read: the largest both ``key`` and the peer passed,
    else the first both ran."""
    mine = {s["c"]: s for s in r.get("capacity", {}).get(key, [])}
    peer = {s["c"]: s for s in r.get("capacity", {}).get(PEER, [])}
    both = sorted(set(mine) & set(peer))
    passed = [c for c in both if mine[c]["passed"] and peer[c]["passed"]]
    return passed[-1] if passed else (both[0] if both else None)


def cpu_at(r: dict[str, Any], key: str, c: int | None) -> float | None:
    found = [s for s in r.get("capacity", {}).get(key, []) if s["c"] == c]
    return found[0]["cpu_per_1000"] if found else None


def get(*keys: str) -> Getter:
    """A getter of ``r[keys[0]][column]...`` (None where absent)."""
    def read(r: dict[str, Any], column: str) -> float | None:
        node: Any = r.get(keys[0], {}).get(column)
        for key in keys[1:]:
            node = node.get(key) if isinstance(node, dict) else None
        return node

    return read


def per_path(figure: str, path: str, *keys: str) -> Getter:
    """A getter reading ``path``'s entry of a variant's column, the peer's own for the peer's."""
    def read(r: dict[str, Any], column: str) -> float | None:
        return get(figure, *keys)(r, column if column == PEER else label(column, path))

    return read


def rows(plan: Plan, names: list[str]) -> list[tuple[str, Getter, Getter | None, int]]:
    """The table's rows: title, value getter, ratio-to getter (None: the peer's value), digits."""
    out: list[tuple[str, Getter, Getter | None, int]] = []
    for stat in ("p50", "p95"):
        for path in PATHS:
            out.append((f"1. TTFT from the GET, added over direct, {stat} (ms): {TITLES[path]}",
                        per_path("ttft_get", path, stat), None, 1))
    for kind in POSTS:
        out.append((f"2. {TITLES[kind]}: POST answered, p50 (ms)"
                    + (" (peer: Django's floor, a view that stores the message only)"
                       if kind == "page" else ""),
                    lambda r, c, k=kind: (r["ttft_post"].get(FLOOR, {}).get("post", {}).get("p50")
                                          if k == "page" else None) if c == PEER else
                    per_path("ttft_post", k, "post", "p50")(r, c), None, 1))
        out.append((f"2. {TITLES[kind]}: its GET → first delta, p50 (ms)",
                    lambda r, c, k=kind: None if c == PEER else
                    per_path("ttft_post", k, "get", "p50")(r, c), None, 1))
        for stat in ("p50", "p95"):
            out.append((f"2. {TITLES[kind]}: POST → first delta, {stat} (ms) (peer: its POST)",
                        per_path("ttft_post", kind, "total", stat), None, 1))
    for path in plan.capacity_paths:
        out.append((f"4. capacity, {TITLES[path]} (streams; higher is better)",
                    lambda r, c, p=path: capacity_of(
                        r["capacity"].get(PEER if c == PEER else label(c, p), [])), None, 0))
    for path in plan.capacity_paths:
        def cpu(r: dict[str, Any], c: str, p: str = path) -> float | None:
            key = label(names[0] if c == PEER else c, p)  # the peer's: at the first variant's
            return cpu_at(r, c if c == PEER else key, cpu_step(r, key))

        def peer_cpu(r: dict[str, Any], c: str, p: str = path) -> float | None:
            return cpu_at(r, PEER, cpu_step(r, label(c, p)))

        out.append((f"5. CPU s per 1,000 deltas, {TITLES[path]} (at the largest step it and the "
                    "peer passed; ratio: to the peer at that step)", cpu, peer_cpu, 2))
    out.append(("5. memory per open stream (KB), ticket", get("memory"), None, 0))
    for stat in ("p50", "p99"):
        out.append((f"6. mass disconnect → upstream closed, {stat} (ms)",
                    get("close", stat), None, 1))
    return out


def writes_table(writes: dict[str, dict[str, dict[str, float]]]) -> str:
    """Figure 3: rows per reply, by table: POST + stream."""
    columns = list(writes)
    tables = sorted({t for w in writes.values() for part in w.values() for t in part})
    lines = ["| table | " + " | ".join(f"{c}: POST + stream" for c in columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    for table in [*tables, "total"]:
        cells = []
        for column in columns:
            post, stream = writes[column]["post"], writes[column]["stream"]
            p = sum(post.values()) if table == "total" else post.get(table, 0.0)
            s = sum(stream.values()) if table == "total" else stream.get(table, 0.0)
            cells.append(f"{p:.1f} + {s:.1f} = {p + s:.1f}")
        lines.append(f"| {table} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def report(rounds: list[dict[str, Any]], names: list[str], plan: Plan, setup: str) -> str:
    columns = [*names, PEER]
    lines = [setup, "",
             "Each cell: the rounds' values, then the median of the rounds' ratios to the peer "
             "(lower is better, but capacity).", "",
             "| figure | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    for title, value, against, digits in rows(plan, names):
        if all(value(r, c) is None for r in rounds for c in columns):
            continue
        to = against or (lambda r, c, v=value: v(r, PEER))
        lines.append(f"| {title} | "
                     + " | ".join(cell(rounds, c, value, to, digits) for c in columns) + " |")
    notes = ["The direct call's own TTFT, p50 (ms): " + " / ".join(
        fmt(r["ttft_get"]["direct"]["p50"], 1) for r in rounds) + " (its value in "
        "figure 1 is absolute)."]
    for number, r in enumerate(rounds, 1):
        read = {key: cpu_step(r, key) for key in r.get("capacity", {}) if key != PEER}
        notes.append(f"Round {number}, figure 5's CPU read at C = " + ", ".join(
            f"{key} {c}" for key, c in read.items()) + ".")
        for key, steps in r.get("capacity", {}).items():
            notes.append(f"Round {number}, steps of {key} (C: complete, TTFT p95 ms, gap p99 "
                         "ms, CPU s/1,000): " + "; ".join(
                             f"{s['c']}: {s['complete']}/{s['c']}, {s['ttft_p95_ms']:.0f}, "
                             f"{s['gap_p99_ms']:.0f}, {s['cpu_per_1000']:.2f}"
                             + ("" if s["passed"] else " FAIL") for s in steps))
    text = "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    if writes := next((r["writes"] for r in rounds if "writes" in r), None):
        text += ("\n3. Database rows written per reply (inserted + updated + deleted, counted "
                 f"by a trigger on each table LIKE {', '.join(TABLES)}; tables with none left "
                 "out):\n\n")
        text += writes_table(writes)
    return text


# -- main -----------------------------------------------------------------------------------------


def parse() -> tuple[argparse.Namespace, Plan]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=REF",
                        help="a chatstream commit to measure (repeat); REF '.' is the working "
                        "tree; the same REF may appear twice, with other --env")
    parser.add_argument("--env", action="append", default=[], metavar="[VARIANT:]NAME=VALUE",
                        help="an environment variable for every variant's worker, or VARIANT's "
                        "only (repeat): SQLITE_SYNCHRONOUS, CONN_MAX_AGE, DATABASE_POOL_SIZE...")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--database", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--users", type=int, default=600)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 1 round, 20 trials, steps 50,100 of 5 s streams")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--ttft-trials", type=int, help="trials of figures 1 and 2 (100)")
    parser.add_argument("--write-replies", type=int, help="replies per path, figure 3 (20)")
    parser.add_argument("--steps", help="capacity steps (100,200,300,400,500,600)")
    parser.add_argument("--step-tokens", type=int, help="deltas per capacity stream (200)")
    parser.add_argument("--capacity-paths", help="start paths of figure 4 (ticket); e.g. "
                        "ticket,noticket")
    parser.add_argument("--memory", type=int, help="open streams for figure 5b (200; 0 skips)")
    parser.add_argument("--close-streams", type=int, help="streams of figure 6 (50; 0 skips)")
    parser.add_argument("--out", type=Path, help="the JSON file (default: in the log directory)")
    options = parser.parse_args()
    plan = QUICK if options.quick else Plan()
    changes: dict[str, Any] = {
        "rounds": options.rounds, "ttft_trials": options.ttft_trials,
        "write_replies": options.write_replies, "step_tokens": options.step_tokens,
        "memory_streams": options.memory, "close_streams": options.close_streams,
        "steps": options.steps and tuple(int(c) for c in options.steps.split(",")),
        "capacity_paths": options.capacity_paths and tuple(options.capacity_paths.split(","))}
    plan = dataclasses.replace(plan, **{k: v for k, v in changes.items() if v is not None})
    if unknown := set(plan.capacity_paths) - set(PATHS):
        parser.error(f"unknown capacity paths {sorted(unknown)}; choose from {PATHS}")
    return options, plan


def environments(options: argparse.Namespace, names: list[str]
                 ) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The run's ``--env`` (every variant's) and each variant's own on top of it."""
    common: dict[str, str] = {}
    own: dict[str, dict[str, str]] = {name: {} for name in names}
    for item in options.env:
        setting, _, value = item.partition("=")
        variant, _, setting = setting.rpartition(":")
        if variant and variant not in own:
            raise SystemExit(f"--env {item}: no variant named {variant!r}")
        (own[variant] if variant else common)[setting] = value
    return common, {name: {**common, **env} for name, env in own.items()}


def describe(ref: str) -> str:
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD" if ref == "." else ref],
                            capture_output=True, text=True, check=True).stdout.strip()
    dirty = ref == "." and subprocess.run([*git, "status", "--porcelain"], capture_output=True,
                                          text=True, check=True).stdout.strip()
    return commit + (" + changes" if dirty else "")


def prepare_database(database: str, logdir: Path, common_env: dict[str, str]) -> None:
    """A fresh database, migrated; this process's Django set up on it (fixtures)."""
    os.environ.update(common_env)  # what the run's settings say, for the fixtures too
    bp.MODEL = SCENARIO
    if database == "sqlite":
        bp.DATABASE_URL = f"sqlite:///{logdir / 'bench.sqlite3'}"
        bp.migrate()
    else:
        bp.DB_NAME = f"chatstream_bench_start_{os.getpid()}"  # not another run's database
        bp.DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{bp.DB_NAME}"
        bp.create_database()
    bp.setup_django()


def main() -> None:
    options, plan = parse()
    refs = dict(v.split("=", 1) for v in options.variant) or {"now": "."}
    common, envs = environments(options, list(refs))
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    logdir = Path(tempfile.mkdtemp(prefix="bench-start-"))
    trees: dict[str, Path] = {}
    for ref in dict.fromkeys(refs.values()):
        trees[ref] = ab.worktree(ref, logdir)
    started, load0 = time.monotonic(), os.getloadavg()[0]
    bp.log(f"logs in {logdir}; variants {refs}; env {envs}; {plan}")
    try:
        prepare_database(options.database, logdir, common)
        variants = {name: (trees[ref], envs[name]) for name, ref in refs.items()}
        rounds = asyncio.run(run(options, plan, variants, logdir))
    finally:
        ab.remove_worktrees(trees.values())
        if options.database == "postgres":
            bp.drop_database()
    described = ", ".join(f"{name} = {describe(ref)}"
                          + (f" ({' '.join(f'{k}={v}' for k, v in envs[name].items())})"
                             if envs[name] else "") for name, ref in refs.items())
    setup = (f"{time.strftime('%Y-%m-%d %H:%M')}{', --quick' if options.quick else ''}, "
             f"{options.database}, uvicorn --loop {options.loop} --http httptools, 1 worker each, "
             f"{options.users} users, load average {load0:.1f} → {os.getloadavg()[0]:.1f}, "
             f"{os.cpu_count()} cores shared, {plan.rounds} round(s), {plan.ttft_trials} TTFT "
             f"trials, {time.monotonic() - started:.0f} s; {described}")
    table = report(rounds, list(refs), plan, setup)
    print()
    print(table)
    out = options.out or logdir / "bench_start.json"
    out.write_text(json.dumps({"setup": setup, "plan": dataclasses.asdict(plan),
                               "variants": refs, "env": envs, "rounds": rounds, "table": table},
                              indent=1, default=str))
    bp.log(f"written to {out}")


if __name__ == "__main__":
    main()

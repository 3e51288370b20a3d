"""Benchmark chatstream's streaming path against a bare Starlette + httpx proxy.

Run: ``.venv/bin/python bench/bench_proxy.py [--quick]``   (not a test; bench/README.md explains)

Needs PostgreSQL at 127.0.0.1:5432 (trust, user postgres) and, for the cross-process Stop,
Redis at 127.0.0.1:6379. It creates (and drops at the end) the database ``chatstream_bench``,
runs the simulated upstream (``python -m chatstream.testing``), chatstream under uvicorn
(``project.asgi``, DEBUG off) and the peer (``bench/bare_proxy.py``) under uvicorn, each in its
own process, and drives them with ``bench/loadgen.py`` from this process. Every figure is
taken for both in the same run, interleaved where that matters, so noise from the shared
2-core machine hits both alike: compare within a run, never across runs.

Workload: the simulator echoes the user's message, which is made of ``" Qxy"`` tokens at 20
tokens/s (``default?tps=20&echo&first_token_delay=0``), so the load generator counts tokens by
counting ``b" Q"`` whatever the framing. chatstream's measured request is the stream GET of a
generation created beforehand in the database (as the message POST would have); the POST is
measured once, for its database writes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import html
import json
import math
import os
import random
import re
import resource
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import loadgen  # noqa: E402
from loadgen import Result, Spec, percentile  # noqa: E402

HOST = "127.0.0.1"
DB_NAME = "chatstream_bench"
DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"
REDIS_URL = "redis://127.0.0.1:6379/7"
MODEL = "default?tps=20&echo&first_token_delay=0"
TPS = 20
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
README = ROOT / "bench" / "README.md"
BEGIN, END = "<!-- bench-proxy:begin -->", "<!-- bench-proxy:end -->"


@dataclass
class Plan:
    """How much of everything one run does (full, or --quick for a smoke run)."""

    ttft_trials: int = 50
    memory_streams: int = 200
    write_streams: int = 20
    steps: tuple[int, ...] = (25, 50, 100, 150, 200, 300, 400, 500, 600)
    steps_2w: tuple[int, ...] = (50, 100, 200, 300, 400, 600, 800, 1000)
    step_tokens: int = 200  # 10 s at 20 tokens/s
    flood: int = 1000
    flood_seconds: float = 12.0
    close_trials: int = 50
    stop_trials: int = 50
    retry: bool = True  # run a failed capacity step once more before calling it failed
    direct_steps: bool = True  # run the direct baseline at every capacity step
    flood_2w: bool = True  # the flood against two workers too


QUICK = Plan(ttft_trials=8, memory_streams=50, write_streams=5, steps=(50, 100),
             steps_2w=(100,), step_tokens=60, flood=200, flood_seconds=5.0,
             close_trials=6, stop_trials=6, retry=False, direct_steps=False, flood_2w=False)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def prompt(tokens: int, marker: str) -> str:
    """A user message the simulator echoes as ``tokens`` counted tokens, then the marker."""
    return " Qxy" * tokens + f" m{marker}"


# -- processes ------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _stat(pid: int) -> tuple[float, int, int]:
    """CPU seconds (user + system), RSS in KB, and thread count of one process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0, 0, 0
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return cpu, rss, threads


class Proc:
    """A server process this benchmark started (uvicorn, or the simulator)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int,
                 logdir: Path, *, probe: str, workers: int = 1, cwd: Path = ROOT) -> None:
        self.name, self.argv, self.port, self.probe, self.workers = name, argv, port, probe, workers
        self.cwd = cwd
        inherited = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
        self.env = {**inherited, **env}
        self.logfile = logdir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        out = self.logfile.open("ab")
        self.process = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: see {self.logfile}")
            if self._answers() and (self.workers == 1 or len(self.workers_pids()) >= self.workers):
                return self
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not start within 40 s: see {self.logfile}")

    def _answers(self) -> bool:
        try:
            with socket.create_connection((HOST, self.port), timeout=1) as sock:
                sock.sendall(f"GET {self.probe} HTTP/1.1\r\nHost: {HOST}\r\n"
                             "Connection: close\r\n\r\n".encode())
                return sock.recv(12).startswith(b"HTTP/1.1")
        except OSError:
            return False

    def workers_pids(self) -> list[int]:
        assert self.process is not None
        if self.workers == 1:
            return [self.process.pid]
        return _children(self.process.pid)

    def cpu(self) -> float:
        return sum(_stat(pid)[0] for pid in self.workers_pids())

    def rss_kb(self) -> int:
        return sum(_stat(pid)[1] for pid in self.workers_pids())

    def threads(self) -> int:
        return sum(_stat(pid)[2] for pid in self.workers_pids())

    def wait_idle(self, *, below: float = 0.05, timeout: float = 30.0) -> None:
        """Wait until the workers use less than ``below`` of a core (finals saved, etc.)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            before = self.cpu()
            time.sleep(0.5)
            if (self.cpu() - before) / 0.5 < below:
                return

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        global our_cpu
        our_cpu += self.cpu()
        pids = self.workers_pids() if self.workers > 1 else []
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            for pid in [*pids, self.process.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.process.wait(5)


# project.settings reads no connection settings from the environment: to measure the deployment
# recipe's database settings, a single-process server is started through this launcher, which
# updates DATABASES["default"] before Django reads it. (uvicorn --workers spawns fresh
# interpreters, so two-worker runs always use project.settings as it is.)
LAUNCH = ("import json, os, sys; import project.settings as s; "
          "sys.setswitchinterval(float(os.environ.get('BENCH_SWITCH_INTERVAL', '0.005'))); "
          "s.DATABASES['default'].update(json.loads(os.environ['BENCH_DATABASE'])); "
          "from uvicorn.main import main; sys.argv[0] = 'uvicorn'; main()")
DB_MODES = {
    "as-is": None,  # project.settings: CONN_MAX_AGE = 0, a new connection per request / call
    "persistent": {"CONN_MAX_AGE": 600, "CONN_HEALTH_CHECKS": True},
    "pool": {"CONN_MAX_AGE": 0, "OPTIONS": {"pool": {"min_size": 4, "max_size": 16,
                                                      "timeout": 10}}},
}
db_mode = "as-is"
remigrate = True
our_cpu = 0.0  # CPU seconds of the servers this run started and stopped


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy since boot (all cores)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / CLK_TCK


def uvicorn(name: str, app: str, env: dict[str, str], logdir: Path, *, probe: str,
            workers: int = 1) -> Proc:
    if app.startswith("project.") and remigrate:
        migrate()  # the checkout may have gained a migration since the run began
    port = free_port()
    args = [app, "--host", HOST, "--port", str(port), "--no-access-log", "--log-level",
            "warning", "--backlog", "4096"]
    argv = [sys.executable, "-m", "uvicorn", *args]
    if workers > 1:
        argv += ["--workers", str(workers)]
    elif app.startswith("project.") and DB_MODES[db_mode] is not None:
        argv = [sys.executable, "-c", LAUNCH, *args]
        env = {**env, "BENCH_DATABASE": json.dumps(DB_MODES[db_mode])}
    return Proc(name, argv, env, port, logdir, probe=probe, workers=workers).start()


BENCH_SECRET_KEY = secrets.token_urlsafe(50)


def chatstream_env(sim_port: int, *, redis: bool) -> dict[str, str]:
    # As a site deploys the demo: DEBUG off, a key of its own; plain HTTP on loopback.
    env = {"DJANGO_SETTINGS_MODULE": "project.settings", "DJANGO_DEBUG": "0",
           "DJANGO_SECRET_KEY": BENCH_SECRET_KEY, "DJANGO_HTTPS": "0",
           "DATABASE_URL": DATABASE_URL, "CHATSTREAM_MODEL": MODEL,
           "CHATSTREAM_SIMULATOR_URL": f"http://{HOST}:{sim_port}/v1"}
    if redis:
        env["REDIS_URL"] = REDIS_URL
    return env


def bare_env(sim_port: int) -> dict[str, str]:
    return {"BARE_UPSTREAM_URL": f"http://{HOST}:{sim_port}/v1", "BARE_MODEL": MODEL,
            "BARE_MAX_CONNECTIONS": "2000"}


# -- the database ---------------------------------------------------------------------------------


def create_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as db:
        db.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        db.execute(f"CREATE DATABASE {DB_NAME}")
    migrate()


def migrate() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    env.update(chatstream_env(0, redis=False))
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT,
                   env=env, check=True)


def drop_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as db:
        db.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")


def setup_django() -> None:
    os.environ.update(chatstream_env(0, redis=False))
    # Fixtures are made with the sync ORM between measurements, from this event loop.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    import django

    django.setup()


class Fixtures:
    """One user, its session cookie, and pending generations made as message_create makes them."""

    def __init__(self) -> None:
        from django.contrib.auth import get_user_model
        from django.contrib.sessions.backends.db import SessionStore

        user = get_user_model().objects.create_user("bench", password="bench-only")
        session = SessionStore()
        session["_auth_user_id"] = str(user.pk)
        session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
        session["_auth_user_hash"] = user.get_session_auth_hash()
        session.create()
        self.user = user
        self.session_key = session.session_key
        self.csrf = secrets.token_hex(16)  # 32 characters: Django accepts the unmasked secret
        self.cookie = f"sessionid={session.session_key}; csrftoken={self.csrf}"
        self.count = 0
        self.close_connection()

    def generations(self, n: int, tokens: int) -> list[tuple[uuid.UUID, str, str]]:
        """``n`` pending generations (own conversation each) echoing ``tokens`` tokens.

        Each with its stream URL as the page gets it: with a ticket for this session.
        """
        from chatstream.stream import issue_ticket

        out = []
        for generation, marker in pending_generations([self.user] * n, tokens, self.next_marker):
            ticket = issue_ticket(generation.pk, self.user.pk, self.session_key)
            out.append((generation.pk, marker, f"/chat/g/{generation.pk}/stream/?ticket={ticket}"))
        self.close_connection()
        return out

    def conversation(self) -> uuid.UUID:
        from chatstream.models import Conversation

        pk = Conversation.objects.create(user=self.user, model=MODEL).pk
        self.close_connection()
        return pk

    def next_marker(self) -> str:
        self.count += 1
        return f"{self.count:06d}"

    @staticmethod
    def close_connection() -> None:
        from django.db import connection

        connection.close()  # its statistics reach pg_stat_* when the backend exits


def pending_generations(owners: Sequence[Any], tokens: int,
                        next_marker: Callable[[], str]) -> list[tuple[Any, str]]:
    """A pending generation for each of ``owners`` (users; own conversation each) echoing
    ``tokens`` tokens, with its marker: what message_create stores, made in bulk."""
    from django.utils import timezone

    from chatstream.domain.history import build_history
    from chatstream.models import Conversation, Generation, Message, QuotaCharge

    now = timezone.now()
    conversations, messages, generations, charges, out = [], [], [], [], []
    for user in owners:
        marker = next_marker()
        conversation = Conversation(user=user, model=MODEL, title=f"bench {marker}")
        message = Message(conversation=conversation, role=Message.Role.USER,
                          content=prompt(tokens, marker), created_at=now)
        generation = Generation(conversation=conversation, user=user,
                                prompt_message=message, model=MODEL)
        # The hold quota.admit() writes with the generation, so finish() settles one.
        charges.append(QuotaCharge(user=user, generation_id=generation.pk, model=MODEL,
                                   at=now, prompt_estimate=tokens, max_tokens=1024,
                                   reserved=tokens + 1024))
        conversations.append(conversation)
        messages.append(message)
        generations.append(generation)
        out.append((generation, marker))
    Conversation.objects.bulk_create(conversations)
    Message.objects.bulk_create(messages)
    for generation in generations:  # what message_create stores with the generation
        generation.upstream_messages = build_history(generation)
    Generation.objects.bulk_create(generations)
    QuotaCharge.objects.bulk_create(charges)
    return out


COUNT_WRITES = """
CREATE TABLE IF NOT EXISTS bench_writes (tbl text PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
CREATE OR REPLACE FUNCTION bench_count_write() RETURNS trigger AS $$
BEGIN
    INSERT INTO bench_writes AS w (tbl, n) VALUES (TG_TABLE_NAME, 1)
    ON CONFLICT (tbl) DO UPDATE SET n = w.n + 1;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
"""


@contextlib.contextmanager
def counting_writes(tables_like: Sequence[str] = ("chatstream_%",)) -> Iterator[None]:
    """Count every row written to chatstream's tables (or those named ``LIKE`` any of
    ``tables_like``), exactly, with a trigger on each.

    (pg_stat_user_tables is no use here: a backend that stays connected, as a pooled one does,
    reports its counts seconds later, so they land in the wrong measurement.)
    """
    import psycopg

    url = DATABASE_URL.replace("postgres://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as db:
        tables = [r[0] for r in db.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
            "AND tablename LIKE ANY(%s)", (list(tables_like),)).fetchall()]
        db.execute(COUNT_WRITES)
        for table in tables:
            db.execute(f"CREATE TRIGGER bench_count AFTER INSERT OR UPDATE OR DELETE ON {table} "
                       "FOR EACH ROW EXECUTE FUNCTION bench_count_write()")
    try:
        yield
    finally:
        with psycopg.connect(url, autocommit=True) as db:
            for table in tables:
                db.execute(f"DROP TRIGGER IF EXISTS bench_count ON {table}")


def table_writes() -> dict[str, int]:
    """Rows inserted, updated and deleted so far, per chatstream table (see counting_writes)."""
    import psycopg

    with psycopg.connect(DATABASE_URL.replace("postgres://", "postgresql://"),
                         autocommit=True) as db:
        rows = db.execute("SELECT tbl, n FROM bench_writes").fetchall()
    return {name: int(n) for name, n in rows}


def pg_connections() -> int:
    import psycopg

    with psycopg.connect(DATABASE_URL.replace("postgres://", "postgresql://"),
                         autocommit=True) as db:
        row = db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                         (DB_NAME,)).fetchone()
    return int(row[0]) - 1 if row else 0


def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}


# -- the three paths ------------------------------------------------------------------------------


class Paths:
    """Builds the request of one stream for each path: direct, bare proxy, chatstream."""

    def __init__(self, sim: int, fixtures: Fixtures) -> None:
        self.sim = sim
        self.fixtures = fixtures

    def direct(self, tokens: int, **close: Any) -> Spec:
        marker = self.fixtures.next_marker()
        body = json.dumps({"model": MODEL, "stream": True, "max_tokens": 1024,
                           "stream_options": {"include_usage": True},
                           "messages": [{"role": "user", "content": prompt(tokens, marker)}]})
        request = loadgen.post(HOST, self.sim, "/v1/chat/completions", body.encode(),
                               headers={"Authorization": "Bearer direct"})
        return Spec(request, tag=marker, **close)

    def bare(self, port: int, tokens: int, **close: Any) -> Spec:
        marker = self.fixtures.next_marker()
        body = json.dumps({"messages": [{"role": "user", "content": prompt(tokens, marker)}]})
        return Spec(loadgen.post(HOST, port, "/stream", body.encode()), tag=marker, **close)

    def chatstream(self, port: int, n: int, tokens: int, **close: Any) -> list[Spec]:
        return [Spec(loadgen.get(HOST, port, url, cookie=self.fixtures.cookie), tag=(pk, marker),
                     **close)
                for pk, marker, url in self.fixtures.generations(n, tokens)]


def sim_records(sim: int) -> list[dict[str, Any]]:
    import httpx

    return httpx.get(f"http://{HOST}:{sim}/_simulator/requests", timeout=30).json()["requests"]


def sim_reset(sim: int) -> None:
    import httpx

    httpx.post(f"http://{HOST}:{sim}/_simulator/reset", timeout=10)


def closed_at_by_marker(sim: int) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for record in sim_records(sim):
        body = record.get("body")
        if not isinstance(body, dict):
            continue
        content = body.get("messages", [{}])[-1].get("content", "")
        match = re.search(r" m(\d{6})$", content)
        if match:
            out[match.group(1)] = record.get("client_closed_at")
    return out


def marker_of(spec: Spec) -> str:
    return spec.tag[1] if isinstance(spec.tag, tuple) else str(spec.tag)


# -- measurements ---------------------------------------------------------------------------------


@dataclass
class Step:
    """One load step against one path."""

    path: str
    streams: int
    summary: dict[str, float]
    cpu: float  # server CPU seconds during the step
    seconds: float
    complete: int
    errors: list[str] = field(default_factory=list)
    ttft_limit_ms: float | None = None  # a pass also needs TTFT p95 within this, when set

    @property
    def tokens(self) -> int:
        return int(self.summary["tokens"])

    @property
    def passed(self) -> bool:
        return (self.complete == self.streams
                and self.summary["gap_p99_ms"] < 100
                and (self.ttft_limit_ms is None
                     or self.summary["ttft_p95_ms"] <= self.ttft_limit_ms))

    @property
    def cpu_per_1000(self) -> float:
        return 1000 * self.cpu / self.tokens if self.tokens else math.nan

    def line(self) -> str:
        s = self.summary
        return (f"{self.path:>10} C={self.streams:<4} complete {self.complete}/{self.streams} "
                f"TTFT p50/p95 {s['ttft_p50_ms']:.0f}/{s['ttft_p95_ms']:.0f} ms, gap p50/p99/max "
                f"{s['gap_p50_ms']:.0f}/{s['gap_p99_ms']:.0f}/{s['gap_max_ms']:.0f} ms, "
                f"{self.tokens} tokens in {s['events']:.0f} events, CPU {self.cpu:.1f} s "
                f"({self.cpu_per_1000:.2f} s/1000) -> {'PASS' if self.passed else 'FAIL'}"
                + (f" errors {sorted(set(self.errors))[:3]}" if self.errors else ""))


async def load_step(path: str, port: int, specs: Sequence[Spec], proc: Proc | None,
                    *, spread: float = 1.0, timeout: float = 60.0,
                    ttft_limit_ms: float | None = None) -> Step:
    cpu0 = proc.cpu() if proc else 0.0
    t0 = time.monotonic()
    results = await loadgen.run(HOST, port, specs, spread=spread, timeout=timeout)
    seconds = time.monotonic() - t0
    cpu = (proc.cpu() - cpu0) if proc else 0.0
    complete = sum(1 for r in results if r.complete and not r.error)
    step = Step(path, len(specs), loadgen.summary(results), cpu, seconds, complete,
                [r.error for r in results if r.error], ttft_limit_ms)
    log(step.line())
    return step


async def flood(path: str, port: int, specs: Sequence[Spec], proc: Proc | None,
                seconds: float) -> dict[str, float]:
    """Offer far more streams than fit; deltas/s delivered in the steady window; then drop all."""
    t0 = time.monotonic()
    cpu0 = proc.cpu() if proc else 0.0
    # The timeout drops every stream still open: a mass disconnect the server must absorb.
    results = await loadgen.run(HOST, port, specs, spread=1.0, timeout=seconds)
    cpu = (proc.cpu() - cpu0) if proc else 0.0
    start, stop = t0 + 2.0, t0 + seconds
    delivered = sum(n for r in results for t, n in zip(r.arrivals, r.counts, strict=True)
                    if start <= t < stop)
    total = sum(r.tokens for r in results)
    ttfts = [t for r in results if (t := r.ttft) is not None]
    rate = delivered / (stop - start)
    out = {"rate": rate, "offered": len(specs) * TPS, "started": len(ttfts),
           "ttft_p50_ms": 1000 * percentile(ttfts, 50), "ttft_p95_ms": 1000 * percentile(ttfts, 95),
           "cpu_per_1000": 1000 * cpu / total if total else math.nan}
    log(f"{path:>10} flood {len(specs)} streams: {rate:,.0f} deltas/s delivered "
        f"(offered {len(specs) * TPS:,}), {len(ttfts)} got a first token, TTFT p50/p95 "
        f"{out['ttft_p50_ms']:.0f}/{out['ttft_p95_ms']:.0f} ms")
    return out


async def ttft_trials(paths: Paths, bare_port: int, cs_port: int, n: int) -> dict[str, Any]:
    """One stream at a time, the three paths interleaved; paired differences to direct."""
    direct, bare, chat = [], [], []
    for i in range(n):
        order = ["direct", "bare", "chatstream"]
        random.Random(i).shuffle(order)
        got: dict[str, float] = {}
        for name in order:
            if name == "direct":
                spec, port = paths.direct(3), paths.sim
            elif name == "bare":
                spec, port = paths.bare(bare_port, 3), bare_port
            else:
                spec, port = paths.chatstream(cs_port, 1, 3)[0], cs_port
            [result] = await loadgen.run(HOST, port, [spec], timeout=10)
            if result.ttft is None:
                raise RuntimeError(f"{name} gave no token: {result.error or result.status}")
            got[name] = result.ttft
            await asyncio.sleep(0.05)
        direct.append(got["direct"])
        bare.append(got["bare"] - got["direct"])
        chat.append(got["chatstream"] - got["direct"])
    out = {"direct_p50": 1000 * percentile(direct, 50), "direct_p95": 1000 * percentile(direct, 95),
           "bare_p50": 1000 * percentile(bare, 50), "bare_p95": 1000 * percentile(bare, 95),
           "cs_p50": 1000 * percentile(chat, 50), "cs_p95": 1000 * percentile(chat, 95)}
    log(f"TTFT direct p50 {out['direct_p50']:.1f} ms; added p50/p95: bare "
        f"{out['bare_p50']:.1f}/{out['bare_p95']:.1f} ms, chatstream "
        f"{out['cs_p50']:.1f}/{out['cs_p95']:.1f} ms")
    return out


async def memory(name: str, proc: Proc, port: int, specs: Sequence[Spec], *,
                 db: bool | None = None) -> dict[str, float]:
    """RSS growth of the worker with len(specs) streams open and streaming, per stream
    (``db``: count the database's connections too; by default for "chatstream" on PostgreSQL)."""
    if db is None:
        db = name == "chatstream" and DATABASE_URL.startswith("postgres")
    proc.wait_idle()
    idle = proc.rss_kb()
    idle_threads = proc.threads()
    results: list[Result] = []
    peak: dict[str, float] = {}

    async def sample() -> None:
        # Once every stream has its first delta (or 25 s have passed), plus a second.
        for _ in range(250):
            await asyncio.sleep(0.1)
            if len(results) == len(specs) and all(r.first_token for r in results):
                break
        await asyncio.sleep(1.0)
        peak["rss"] = proc.rss_kb()
        peak["threads"] = proc.threads()
        peak["db"] = pg_connections() if db else 0
        peak["streaming"] = sum(1 for r in results if r.first_token is not None)

    sampler = asyncio.create_task(sample())
    # 30 s streams: still open when sampled; dropped as soon as the sample is taken.
    runner = asyncio.create_task(loadgen.run(HOST, port, specs, spread=1.0, timeout=40,
                                             on_start=results.append))
    await sampler
    for result in results:
        result.spec.close_after_tokens = 0  # the next read closes it
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(runner, 45)
    per = (peak["rss"] - idle) / len(specs)
    log(f"{name:>10} memory: idle {idle / 1024:.1f} MB, {len(specs)} open streams "
        f"{peak['rss'] / 1024:.1f} MB -> {per:.0f} KB per stream; threads {idle_threads} -> "
        f"{peak['threads']:.0f}; database connections {peak['db']:.0f}; "
        f"{peak['streaming']:.0f} streaming when sampled")
    return {"per_kb": per, "threads": peak["threads"], "db": peak["db"],
            "idle_threads": idle_threads, "streaming": peak["streaming"]}


async def close_trials(paths: Paths, bare_port: int, cs_port: int,
                       n: int) -> dict[str, dict[str, float]]:
    """Client drops mid-stream; time until the simulator sees the upstream connection close."""
    specs: dict[str, list[Spec]] = {"bare": [], "chatstream": []}
    closed: dict[str, list[Result]] = {"bare": [], "chatstream": []}
    sim_reset(paths.sim)
    for i in range(n):
        delay = random.Random(i).uniform(0.05, 0.25)
        for name in ("bare", "chatstream") if i % 2 else ("chatstream", "bare"):
            if name == "bare":
                spec, port = paths.bare(bare_port, 200, close_after_tokens=1,
                                        close_delay=delay), bare_port
            else:
                spec, port = paths.chatstream(cs_port, 1, 200, close_after_tokens=1,
                                              close_delay=delay)[0], cs_port
            [result] = await loadgen.run(HOST, port, [spec], timeout=10)
            specs[name].append(spec)
            closed[name].append(result)
            await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)
    upstream = closed_at_by_marker(paths.sim)
    out = {}
    for name, results in closed.items():
        lat = [upstream[marker_of(r.spec)] - r.closed_by_client  # type: ignore[operator]
               for r in results
               if r.closed_by_client is not None and upstream.get(marker_of(r.spec)) is not None]
        out[name] = {"p50": 1000 * percentile(lat, 50), "p99": 1000 * percentile(lat, 99),
                     "max": 1000 * max(lat, default=math.nan), "n": len(lat)}
        log(f"{name:>10} disconnect -> upstream closed: p50 {out[name]['p50']:.1f} ms, p99 "
            f"{out[name]['p99']:.1f} ms, max {out[name]['max']:.1f} ms ({len(lat)}/{n} seen)")
    return out


async def fetch(port: int, request: bytes) -> int:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(request)
        line = await asyncio.wait_for(reader.readline(), 10)
        return int(line[9:12])
    finally:
        writer.close()


def cancel_request(fixtures: Fixtures, port: int, pk: uuid.UUID) -> bytes:
    return loadgen.post(HOST, port, f"/chat/g/{pk}/cancel/", b"",
                        content_type="application/x-www-form-urlencoded",
                        headers={"Cookie": fixtures.cookie, "X-CSRFToken": fixtures.csrf,
                                 "HX-Request": "true", "Connection": "close"})


async def stop_trials(paths: Paths, stream_port: int, stop_port: int, n: int,
                      label: str) -> dict[str, float]:
    """Stop pressed mid-stream (POST to ``stop_port``); time until the upstream closes."""
    sim_reset(paths.sim)
    pressed: list[tuple[str, float]] = []
    done_after: list[float] = []
    for i in range(n):
        spec = paths.chatstream(stream_port, 1, 200)[0]
        result = Result(spec)
        task = asyncio.create_task(loadgen.open_stream(HOST, stream_port, spec, result,
                                                       timeout=20))
        for _ in range(2000):
            if result.first_token is not None or task.done():
                break
            await asyncio.sleep(0.002)
        await asyncio.sleep(random.Random(i).uniform(0.05, 0.25))
        t = time.monotonic()
        status = await fetch(stop_port, cancel_request(paths.fixtures, stop_port, spec.tag[0]))
        if status != 204:
            raise RuntimeError(f"Stop answered HTTP {status}")
        await task
        pressed.append((marker_of(spec), t))
        if result.ended is not None and result.complete:
            done_after.append(result.ended - t)
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)
    upstream = closed_at_by_marker(paths.sim)
    lat = [closed - t for m, t in pressed if (closed := upstream.get(m)) is not None]
    out = {"p50": 1000 * percentile(lat, 50), "p99": 1000 * percentile(lat, 99),
           "max": 1000 * max(lat, default=math.nan), "n": len(lat),
           "done_p50": 1000 * percentile(done_after, 50)}
    log(f"Stop ({label}) -> upstream closed: p50 {out['p50']:.1f} ms, p99 {out['p99']:.1f} ms, "
        f"max {out['max']:.1f} ms ({len(lat)}/{n}); browser's stream ended p50 "
        f"{out['done_p50']:.1f} ms")
    return out


async def writes(paths: Paths, proc: Proc, port: int, plan: Plan) -> dict[str, float]:
    """Database rows written per generation: the message POST, then long and short streams."""
    import httpx

    fixtures = paths.fixtures
    n = plan.write_streams
    conversations = [fixtures.conversation() for _ in range(n)]
    with counting_writes():
        before = table_writes()
        urls = []
        async with httpx.AsyncClient(base_url=f"http://{HOST}:{port}", timeout=10, headers={
                "Cookie": fixtures.cookie, "X-CSRFToken": fixtures.csrf,
                "HX-Request": "true"}) as c:
            for conversation in conversations:
                reply = await c.post(f"/chat/c/{conversation}/messages/",
                                     data={"content": prompt(20, fixtures.next_marker()),
                                           "model": MODEL})
                match = re.search(r'sse-connect="(/chat/g/[0-9a-f-]+/stream/[^"]*)"', reply.text)
                if reply.status_code != 200 or not match:
                    raise RuntimeError(
                        f"message POST answered {reply.status_code}: {reply.text[:200]}")
                urls.append(html.unescape(match.group(1)))  # the page's, ticket included
        posted = table_writes()
        post_rows = sum(diff(posted, before).values())
        # The posted generations stream too (short), so the full two-request flow is counted.
        await loadgen.run(HOST, port, [Spec(loadgen.get(HOST, port, url, cookie=fixtures.cookie))
                                       for url in urls], spread=0.5, timeout=30)
        proc.wait_idle()
        # Pending generations made beforehand, as the POST would: their rows are not counted.
        short_specs = paths.chatstream(port, n, 20)
        long_specs = paths.chatstream(port, n, plan.step_tokens)
        short0 = table_writes()
        await loadgen.run(HOST, port, short_specs, spread=0.5, timeout=30)
        proc.wait_idle()
        short1 = table_writes()
        await loadgen.run(HOST, port, long_specs, spread=0.5, timeout=60)
        proc.wait_idle()
        long1 = table_writes()
    d_short, d_long = diff(short1, short0), diff(long1, short1)
    rows_short = sum(d_short.values()) / n
    rows_long = sum(d_long.values()) / n
    seconds_short, seconds_long = 20 / TPS, plan.step_tokens / TPS
    per_second = (rows_long - rows_short) / (seconds_long - seconds_short)
    constant = rows_short - per_second * seconds_short
    out = {"post": post_rows / n, "short": rows_short, "long": rows_long,
           "per_second": per_second, "constant": constant, "long_seconds": seconds_long}
    log(f"DB rows written: message POST {out['post']:.1f}/generation; stream GET "
        f"{rows_short:.1f} ({seconds_short:.0f} s stream), {rows_long:.1f} ({seconds_long:.0f} s "
        f"stream) -> {constant:.1f} + {per_second:.2f}/s of streaming; tables "
        f"{ {k: round(v / n, 1) for k, v in d_long.items()} }")
    return out


async def capacity(paths: Paths, servers: dict[str, Proc], ports: dict[str, int],
                   steps: Sequence[int], tokens: int, *, direct: bool,
                   retry: bool = True) -> dict[str, list[Step]]:
    """Step C up for every path until its p99 gap passes 100 ms (or a stream fails)."""
    out: dict[str, list[Step]] = {name: [] for name in ports}
    failed: set[str] = set()
    for c in steps:
        names = [n for n in ports if n not in failed and (direct or n != "direct")]
        if not [n for n in names if n != "direct"]:
            break
        for name in names:
            port = ports[name]
            if name == "direct":
                specs = [paths.direct(tokens) for _ in range(c)]
            elif name == "bare":
                specs = [paths.bare(port, tokens) for _ in range(c)]
            else:
                specs = paths.chatstream(port, c, tokens)
            step = await load_step(name, port, specs, servers.get(name),
                                   timeout=tokens / TPS + 30)
            if name in servers:
                servers[name].wait_idle()
            sim_reset(paths.sim)
            if not step.passed and retry:
                # The machine is shared: a step fails only if it fails twice running.
                log(f"{name:>10} C={c}: failed once, trying again")
                specs = ([paths.direct(tokens) for _ in range(c)] if name == "direct" else
                         [paths.bare(port, tokens) for _ in range(c)] if name == "bare" else
                         paths.chatstream(port, c, tokens))
                again = await load_step(name, port, specs, servers.get(name),
                                        timeout=tokens / TPS + 30)
                if name in servers:
                    servers[name].wait_idle()
                sim_reset(paths.sim)
                step = again if again.passed else step
            out[name].append(step)
            if not step.passed:
                failed.add(name)
    return out


def best(steps: Sequence[Step]) -> Step | None:
    """The largest step passed before the first failure."""
    found = None
    for step in steps:
        if not step.passed:
            break
        found = step
    return found


# -- report ---------------------------------------------------------------------------------------


def fmt(value: float, digits: int = 0) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else f"{value:,.{digits}f}"


def capacity_text(steps: Sequence[Step], tested: Sequence[int]) -> str:
    if not steps:
        return "—"
    b = best(steps)
    if b is None:
        return f"< {steps[0].streams}"
    last = steps[-1]
    if last.passed:
        return f"≥ {b.streams}"
    return f"{b.streams}"


def report(r: dict[str, Any], plan: Plan, quick: bool) -> str:
    """The Markdown table (and notes) of whatever figures ``r`` holds."""
    rows: list[tuple[str, str, str, str, str, bool | None]] = []
    cap1, cap2 = r.get("cap1", {}), r.get("cap2", {})
    b1, c1 = best(cap1.get("bare", [])), best(cap1.get("chatstream", []))
    b2, c2 = best(cap2.get("bare", [])), best(cap2.get("chatstream", []))

    def ratio(a: Step | None, b: Step | None) -> float:
        return a.streams / b.streams if a and b else math.nan

    if t := r.get("ttft"):
        rows.append(("1. TTFT added over direct, 1 stream at a time, p50 / p95 (ms)",
                     f"TTFT itself {fmt(t['direct_p50'], 1)} / {fmt(t['direct_p95'], 1)}",
                     f"{fmt(t['bare_p50'], 1)} / {fmt(t['bare_p95'], 1)}",
                     f"{fmt(t['cs_p50'], 1)} / {fmt(t['cs_p95'], 1)}",
                     "≤ bare + 1 ms", t["cs_p50"] <= t["bare_p50"] + 1))
    if cap1:
        rows.append(("2. Capacity, 1 worker: most streams at 20 deltas/s with p99 gap < 100 ms "
                     "(all complete)",
                     capacity_text(cap1.get("direct", []), plan.steps),
                     capacity_text(cap1["bare"], plan.steps),
                     capacity_text(cap1["chatstream"], plan.steps)
                     + (f" ({fmt(ratio(c1, b1), 2)}× bare)" if c1 and b1 else ""),
                     "≥ bare (aim 1.5×)",
                     bool(c1) and (not b1 or c1.streams >= b1.streams)))
    if fl1 := r.get("flood1"):
        rows.append((f"2b. Deltas/s delivered, 1 worker, offered {plan.flood:,} streams "
                     f"({plan.flood * TPS:,}/s)", fmt(fl1["direct"]["rate"]),
                     fmt(fl1["bare"]["rate"]), fmt(fl1["chatstream"]["rate"]), "≥ bare",
                     fl1["chatstream"]["rate"] >= fl1["bare"]["rate"]))
    if cap1:
        both = [c for c in plan.steps
                if any(s.streams == c for s in cap1["bare"])
                and any(s.streams == c for s in cap1["chatstream"])]
        at = both[-1] if both else None
        if c1 and b1:
            at = min(c1.streams, b1.streams)
        pick = {name: next((s for s in cap1[name] if s.streams == at), None)
                for name in ("bare", "chatstream")}
        flood = r.get("flood1", {})
        cells = {name: fmt(pick[name].cpu_per_1000 if pick[name] else math.nan, 2)
                 + (f"; {fmt(flood[name]['cpu_per_1000'], 2)}" if name in flood else "")
                 for name in pick}
        rows.append((f"3. Server CPU seconds per 1,000 deltas (C={at}; flood)", "—",
                     cells["bare"], cells["chatstream"], "—", None))
    if mem := r.get("memory"):
        rows.append((f"4. Memory per open stream, C={plan.memory_streams} (KB of RSS)", "—",
                     fmt(mem["bare"]["per_kb"]), fmt(mem["chatstream"]["per_kb"]), "< 64 KB",
                     mem["chatstream"]["per_kb"] < 64))
    if w := r.get("writes"):
        rows.append(("5. Database rows written per generation: stream GET = constant + per "
                     "second streamed (message POST adds)", "—", "none",
                     f"{fmt(w['constant'], 1)} + {fmt(w['per_second'], 2)}/s ({fmt(w['post'], 1)})",
                     "≤ 1/s + constant", w["per_second"] <= 1.05))
    if cl := r.get("close"):
        rows.append(("6a. Client disconnect → upstream closed, p50 / p99 (ms)", "—",
                     f"{fmt(cl['bare']['p50'], 1)} / {fmt(cl['bare']['p99'], 1)}",
                     f"{fmt(cl['chatstream']['p50'], 1)} / {fmt(cl['chatstream']['p99'], 1)}",
                     "p99 < 50 ms", cl["chatstream"]["p99"] < 50))
    if st := r.get("stop"):
        rows.append(("6b. Stop → upstream closed, p50 / p99 (ms): in-memory layer, 1 process",
                     "—", "no Stop", f"{fmt(st['p50'], 1)} / {fmt(st['p99'], 1)}",
                     "p99 < 100 ms", st["p99"] < 100))
    if st_r := r.get("stop_redis"):
        rows.append(("6c. Stop → upstream closed, p50 / p99 (ms): Redis layer, Stop sent to "
                     "another process", "—", "no Stop",
                     f"{fmt(st_r['p50'], 1)} / {fmt(st_r['p99'], 1)}", "p99 < 100 ms",
                     st_r["p99"] < 100))
    if cap2:
        rows.append(("7. Capacity, 2 workers (× the same path's 1 worker)", "—",
                     f"{capacity_text(cap2['bare'], plan.steps_2w)} ({fmt(ratio(b2, b1), 2)}×)",
                     f"{capacity_text(cap2['chatstream'], plan.steps_2w)} "
                     f"({fmt(ratio(c2, c1), 2)}×)",
                     "≥ 1.8× one worker", bool(c2 and c1) and ratio(c2, c1) >= 1.8))
    if fl2 := r.get("flood2"):
        rows.append((f"7b. Deltas/s delivered, 2 workers, offered {plan.flood:,} streams", "—",
                     fmt(fl2["bare"]["rate"]), fmt(fl2["chatstream"]["rate"]), "—", None))
    machine = r.get("machine", {})
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M')}"
        f"{' (--quick: a smoke run, small N)' if quick else ''}; chatstream database "
        f"connections: {db_mode}; {os.cpu_count()} cores shared by upstream, server(s), load "
        f"generator and whatever else runs; load average {machine.get('load', '?')}; other "
        f"processes used {fmt(machine.get('others', math.nan))} % of the machine's CPU during "
        f"the run; PostgreSQL; uvicorn {r.get('versions', '?')}, DEBUG off.",
        "",
        "| figure | direct to upstream | bare proxy | chatstream | goal | met |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, direct, bare, chat, goal, met in rows:
        mark = "—" if met is None else ("met" if met else "**missed**")
        lines.append(f"| {name} | {direct} | {bare} | {chat} | {goal} | {mark} |")
    notes = []
    if mem:
        notes.append(f"Memory phase: chatstream's threads {mem['chatstream']['idle_threads']} → "
                     f"{mem['chatstream']['threads']:.0f} and {mem['chatstream']['db']:.0f} open "
                     f"database connections with {plan.memory_streams} open streams, "
                     f"{mem['chatstream']['streaming']:.0f} of them streaming when sampled (bare: "
                     f"threads {mem['bare']['idle_threads']} → {mem['bare']['threads']:.0f}, "
                     f"{mem['bare']['streaming']:.0f} streaming).")
    if fl1:
        notes.append("Flood, 1 worker: streams that got a first token, TTFT p50 / p95 (ms): "
                     + ", ".join(f"{k} {v['started']:.0f}, {fmt(v['ttft_p50_ms'])} / "
                                 f"{fmt(v['ttft_p95_ms'])}" for k, v in fl1.items()) + ".")
    if w:
        notes.append(f"Database: {fmt(w['short'], 1)} rows for a 1 s stream, {fmt(w['long'], 1)} "
                     f"for a {w['long_seconds']:.0f} s one; rows inserted, updated or deleted, "
                     "counted by a trigger on each chatstream table during this phase only.")
    for label, cap in (("1 worker", cap1), ("2 workers", cap2)):
        for name, steps in cap.items():
            if not steps:
                continue
            notes.append(f"Steps, {label}, {name} (C: p99 gap ms, TTFT p95 ms, complete, "
                         "events per delta): " + "; ".join(
                             f"{s.streams}: {s.summary['gap_p99_ms']:.0f}, "
                             f"{s.summary['ttft_p95_ms']:.0f}, {s.complete}/{s.streams}, "
                             f"{s.summary['events'] / max(1, s.tokens):.2f}" for s in steps))
    return "\n".join(lines + [""] + [f"- {n}" for n in notes]) + "\n"


def write_readme(table: str) -> None:
    text = README.read_text() if README.exists() else ""
    block = f"{BEGIN}\n{table}{END}"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip() + "\n\n## Latest run\n\n" + block + "\n"
    README.write_text(text)


# -- main -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def running(procs: list[Proc]) -> Iterator[None]:
    try:
        yield
    finally:
        for proc in reversed(procs):
            proc.stop()


async def warm(paths: Paths, bare_port: int | None, cs_port: int | None) -> None:
    """A few streams through each server (imports, pools); any failure stops the run."""
    specs_b = [paths.bare(bare_port, 5) for _ in range(20)] if bare_port else []
    specs_c = paths.chatstream(cs_port, 20, 5) if cs_port else []
    for port, specs in ((bare_port, specs_b), (cs_port, specs_c)):
        if port:
            results = await loadgen.run(HOST, port, specs, spread=0.5, timeout=20)
            failed = [r.error for r in results if r.error or not r.complete]
            if failed:
                raise RuntimeError(f"warm-up streams failed on port {port}: {failed[:3]} "
                                   "(see the server logs)")


PHASES = ("ttft", "memory", "writes", "cap1", "flood1", "close", "stop", "cap2", "flood2",
          "stop_redis")


async def main_async(plan: Plan, phases: set[str], logdir: Path) -> dict[str, Any]:
    r: dict[str, Any] = {}
    sim = Proc("simulator", [sys.executable, "-m", "chatstream.testing", "--port",
                             str(port := free_port())], {}, port, logdir,
               probe="/v1/models").start()
    procs = [sim]
    with running(procs):
        fixtures = Fixtures()
        paths = Paths(sim.port, fixtures)
        import uvicorn as uv

        r["versions"] = f"{uv.__version__} (h11, asyncio loop)"
        if phases & {"ttft", "memory", "writes", "cap1", "flood1", "close", "stop"}:
            cs = uvicorn("chatstream", "project.asgi:application",
                         chatstream_env(sim.port, redis=False), logdir, probe="/accounts/login/")
            procs.append(cs)
            bare = uvicorn("bare", "bench.bare_proxy:app", bare_env(sim.port), logdir,
                           probe="/stream")
            procs.append(bare)
            await warm(paths, bare.port, cs.port)
            ports = {"direct": sim.port, "bare": bare.port, "chatstream": cs.port}
            servers = {"bare": bare, "chatstream": cs, "direct": sim}
            await one_worker(r, phases, plan, paths, servers, ports)
            for proc in (cs, bare):
                proc.stop()
                procs.remove(proc)

        if phases & {"cap2", "flood2"}:
            log("-- 7. two worker processes (chatstream with the Redis channel layer)")
            cs2 = uvicorn("chatstream-2w", "project.asgi:application",
                          chatstream_env(sim.port, redis=True), logdir,
                          probe="/accounts/login/", workers=2)
            procs.append(cs2)
            bare2 = uvicorn("bare-2w", "bench.bare_proxy:app", bare_env(sim.port), logdir,
                            probe="/stream", workers=2)
            procs.append(bare2)
            for _ in range(2 if plan.retry else 1):  # each worker warmed, roughly
                await warm(paths, bare2.port, cs2.port)
            ports2 = {"bare": bare2.port, "chatstream": cs2.port}
            servers2 = {"bare": bare2, "chatstream": cs2}
            if "cap2" in phases:
                r["cap2"] = await capacity(paths, servers2, ports2, plan.steps_2w,
                                           plan.step_tokens, direct=False, retry=plan.retry)
            if "flood2" in phases and plan.flood_2w:
                r["flood2"] = {}
                for name in ("bare", "chatstream"):
                    port = ports2[name]
                    specs = ([paths.bare(port, 400) for _ in range(plan.flood)]
                             if name == "bare" else paths.chatstream(port, plan.flood, 400))
                    r["flood2"][name] = await flood(name, port, specs, servers2[name],
                                                    plan.flood_seconds)
                    servers2[name].wait_idle(timeout=60)
                    sim_reset(sim.port)
            for proc in (cs2, bare2):
                proc.stop()
                procs.remove(proc)

        if "stop_redis" in phases:
            log("-- 6c. Stop across processes through Redis")
            try:
                a = uvicorn("chatstream-a", "project.asgi:application",
                            chatstream_env(sim.port, redis=True), logdir,
                            probe="/accounts/login/")
                procs.append(a)
                b = uvicorn("chatstream-b", "project.asgi:application",
                            chatstream_env(sim.port, redis=True), logdir,
                            probe="/accounts/login/")
                procs.append(b)
                await warm(paths, None, a.port)
                await warm(paths, None, b.port)
                r["stop_redis"] = await stop_trials(paths, a.port, b.port, plan.stop_trials,
                                                    "Redis, stream on process A, Stop sent to B")
            except Exception as exc:  # Redis missing: report the rest
                log(f"Stop across processes skipped: {exc!r}")
    return r


async def one_worker(r: dict[str, Any], phases: set[str], plan: Plan, paths: Paths,
                     servers: dict[str, Proc], ports: dict[str, int]) -> None:
    bare, cs = servers["bare"], servers["chatstream"]
    if "ttft" in phases:
        log("-- 1. time to first token, one stream at a time")
        r["ttft"] = await ttft_trials(paths, bare.port, cs.port, plan.ttft_trials)
    if "memory" in phases:
        log("-- 4. memory per open stream")
        r["memory"] = {
            "bare": await memory("bare", bare, bare.port,
                                 [paths.bare(bare.port, 600) for _ in range(plan.memory_streams)]),
            "chatstream": await memory("chatstream", cs, cs.port,
                                       paths.chatstream(cs.port, plan.memory_streams, 600)),
        }
        for proc in (bare, cs):
            proc.wait_idle()
    if "writes" in phases:
        log("-- 5. database writes")
        r["writes"] = await writes(paths, cs, cs.port, plan)
    if "cap1" in phases:
        log("-- 2/3. capacity of one worker")
        r["cap1"] = await capacity(paths, servers, ports, plan.steps, plan.step_tokens,
                                   direct=plan.direct_steps, retry=plan.retry)
    if "flood1" in phases:
        log("-- 2b. flood, one worker")
        r["flood1"] = {}
        for name in ("direct", "bare", "chatstream"):
            port = ports[name]
            if name == "direct":
                specs = [paths.direct(400) for _ in range(plan.flood)]
            elif name == "bare":
                specs = [paths.bare(port, 400) for _ in range(plan.flood)]
            else:
                specs = paths.chatstream(port, plan.flood, 400)
            r["flood1"][name] = await flood(name, port, specs, servers[name], plan.flood_seconds)
            servers[name].wait_idle(timeout=60)
            sim_reset(paths.sim)
    if "close" in phases:
        log("-- 6a. client disconnect")
        r["close"] = await close_trials(paths, bare.port, cs.port, plan.close_trials)
    if "stop" in phases:
        log("-- 6b. Stop, same process")
        r["stop"] = await stop_trials(paths, cs.port, cs.port, plan.stop_trials,
                                      "in-memory layer, same process")


def main() -> None:
    parser = argparse.ArgumentParser(description="chatstream vs a bare Starlette proxy")
    parser.add_argument("--quick", action="store_true", help="a smoke run in under 2 minutes")
    parser.add_argument("--keep-db", action="store_true", help="do not drop chatstream_bench")
    parser.add_argument("--only", default="", help=f"comma-separated phases of {PHASES} "
                        "(figures only; the README is not written)")
    parser.add_argument("--db", choices=list(DB_MODES), default="as-is",
                        help="chatstream's database connections in one-worker runs: as-is "
                        "(project.settings, CONN_MAX_AGE=0), persistent (CONN_MAX_AGE=600) "
                        "or pool (psycopg pool); the README is written for as-is only")
    parser.add_argument("--steps", default="", help="capacity steps, e.g. 100,200 (with --only)")
    parser.add_argument("--ttft-trials", type=int, default=0,
                        help="streams per path in the TTFT phase (default 50; the README is not "
                        "written when given)")
    options = parser.parse_args()
    plan = QUICK if options.quick else Plan()
    global db_mode, remigrate
    db_mode = options.db
    remigrate = not options.quick
    phases = set(options.only.split(",")) if options.only else set(PHASES)
    if phases - set(PHASES):
        parser.error(f"unknown phases {sorted(phases - set(PHASES))}; choose from {PHASES}")
    if options.steps:
        steps = tuple(int(c) for c in options.steps.split(","))
        plan = dataclasses.replace(plan, steps=steps, steps_2w=steps)
    if options.ttft_trials:
        plan = dataclasses.replace(plan, ttft_trials=options.ttft_trials)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    logdir = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    started = time.monotonic()
    log(f"logs in {logdir}; creating database {DB_NAME}")
    create_database()
    setup_django()
    load0 = os.getloadavg()[0]
    busy0, wall0, cpu0 = machine_busy(), time.monotonic(), os.times()
    try:
        r = asyncio.run(main_async(plan, phases, logdir))
    finally:
        if not options.keep_db:
            with contextlib.suppress(Exception):
                drop_database()
    cpu1, busy1, wall1 = os.times(), machine_busy(), time.monotonic()
    mine = our_cpu + (cpu1.user + cpu1.system - cpu0.user - cpu0.system)
    r["machine"] = {"load": f"{load0:.1f} → {os.getloadavg()[0]:.1f}",
                    "others": 100 * (busy1 - busy0 - mine) / ((wall1 - wall0) * os.cpu_count()),
                    "loadgen": cpu1.user + cpu1.system - cpu0.user - cpu0.system}
    table = report(r, plan, options.quick)
    table += (f"- The load generator (the benchmark process) used {r['machine']['loadgen']:.0f} "
              f"CPU s over the {time.monotonic() - started:.0f} s run.\n")
    print()
    print(table)
    if options.only or options.quick or options.db != "as-is" or options.ttft_trials:
        log("partial, quick or what-if run: README not written")
        return
    write_readme(table)
    log(f"table written into {README.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

"""A/B of posting a message: the page's ``message-create`` POST at several commits.

Run: ``.venv/bin/python bench/bench_send.py --variant ref=<commit> --variant new=<commit>
[--database postgres|sqlite] [--rounds 3] [--posts 300]``   (not a test; see bench/README.md)

What a POST does before any stream: the session and the user, the form, the message and the
generation, the history sent upstream, the request hooks (none configured here: the figure
is what an extension point costs a site that does not use it) and the quota's admission. Each
variant runs in a process of its own, from its own worktree, on a database of its own migrated
by its own code, through Django's test client (no network: the view and
the database are all there is to measure). Rounds alternate the variants' order; the figure
is each variant's median time per POST, and its ratio to the first variant in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_proxy as bp
from bench_ab import worktree

ROOT = bp.ROOT
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def child(posts: int) -> None:
    """In a variant's worktree: log in, then time ``posts`` message POSTs."""
    import django

    # The variant's worktree (the working directory) first: bench_proxy puts this checkout on
    # the path when imported.
    sys.path.insert(0, os.getcwd())
    assert "chatstream" not in sys.modules
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    django.setup()
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    from chatstream.models import Conversation

    user, _ = get_user_model().objects.get_or_create(username=f"bench-send-{os.getpid()}")
    client = Client()
    client.force_login(user)
    times = []
    cpu = time.process_time()
    for _ in range(posts // 50 + 1):  # a conversation holds a bounded number of messages
        conversation = Conversation.objects.create(user=user, model=os.environ[
            "CHATSTREAM_MODEL"])
        url = reverse("chatstream:message-create", args=[conversation.pk])
        for i in range(min(50, posts - len(times))):
            start = time.perf_counter()
            response = client.post(url, {"content": f"Question {i} " + "q" * 200},
                                   headers={"HX-Request": "true"})
            times.append(time.perf_counter() - start)
            assert response.status_code == 200, response.status_code
    print(json.dumps({"p50_ms": statistics.median(times[10:]) * 1000,
                      "cpu_ms": (time.process_time() - cpu) / len(times) * 1000}))


def run_variant(path: Path, posts: int, env: dict[str, str]) -> dict[str, float]:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(1, sys.argv[2]); "
            "import bench_send; bench_send.child(int(sys.argv[3]))")
    out = subprocess.run([sys.executable, "-c", code, str(path), str(ROOT / "bench"),
                          str(posts)], cwd=path, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{path}: {out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def database(name: str, kind: str, tmp: str, path: Path, env: dict[str, str]) -> dict[str, str]:
    """A database of the variant's own, migrated by its own code: variants may differ in their
    migrations (what they store for a new generation is part of what is measured)."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp}/bench-send-{name}.sqlite3"
    else:
        import psycopg

        db = f"chatstream_bench_send_{name}"
        with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            connection.execute(f"CREATE DATABASE {db}")
        url = f"postgres://postgres@127.0.0.1:5432/{db}"
    env = {**env, "DATABASE_URL": url}
    subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                    "from django.core.management import execute_from_command_line; "
                    "execute_from_command_line(['manage.py', 'migrate', '--noinput', '-v', '0'])",
                    str(path)], cwd=path, env=env, check=True)
    return env


def drop(name: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS chatstream_bench_send_{name} WITH (FORCE)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", required=True, help="name=commit")
    parser.add_argument("--database", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--posts", type=int, default=300)
    options = parser.parse_args()
    variants = dict(v.split("=", 1) for v in options.variant)
    names = list(variants)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: worktree(ref, Path(tmp)) for name, ref in variants.items()}
        base = {**os.environ, **bp.chatstream_env(0, redis=False)}
        base["CHATSTREAM_SIMULATOR_URL"] = "http://127.0.0.1:9/v1"  # never called: no stream
        try:
            envs = {name: database(name, options.database, tmp, paths[name], base)
                    for name in names}
            rows = []
            for n in range(options.rounds):
                order = names if n % 2 == 0 else names[::-1]
                rows.append({name: run_variant(paths[name], options.posts, envs[name])
                             for name in order})
        finally:
            for name, path in paths.items():
                if options.database == "postgres":
                    drop(name)
                if path != ROOT:
                    subprocess.run(["git", "worktree", "remove", "--force", str(path)],
                                   cwd=ROOT, check=False, capture_output=True)
    first = names[0]
    print(f"{options.database}, {options.posts} POSTs per variant per round")
    for figure in ("p50_ms", "cpu_ms"):
        for name in names:
            values = [row[name][figure] for row in rows]
            ratios = [row[name][figure] / row[first][figure] for row in rows]
            print(f"  {figure:7} {name:6} " + " / ".join(f"{v:.2f}" for v in values)
                  + f"  ({statistics.median(ratios):.2f}x)")


if __name__ == "__main__":
    main()

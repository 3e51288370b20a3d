"""A/B of reading a conversation's history (``build_history``) at two commits, in one process.

Run: ``.venv/bin/python bench/bench_history.py --before <commit> [--after .]
[--database postgres|sqlite] [--calls 300]``   (not a test; see bench/README.md)

What the message POST spends on the history before a later message: the questions before it,
their latest replies with text, read in batches. Both commits' ``chatstream/domain/history.py``
are loaded (``git show``; ``.`` the working tree) as modules beside each other, so the same
rows, connection and interpreter serve both; the database is a fresh SQLite file or a fresh
PostgreSQL database, migrated by this checkout. For conversations with 1, 5 and 12 exchanges
before the new message, the two are called in turn, in a new random order each time; the
figure is each one's median time per call, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import bench_proxy as bp

ROOT = bp.ROOT
EXCHANGES = (1, 5, 12)


def history_at(ref: str, workdir: Path) -> ModuleType:
    """``chatstream/domain/history.py`` as it is at ``ref``, as a module of the package."""
    path = ROOT / "chatstream" / "domain" / "history.py"
    if ref != ".":
        path = workdir / f"history_{ref}.py"
        path.write_text(subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{ref}:chatstream/domain/history.py"],
            capture_output=True, text=True, check=True).stdout)
    spec = importlib.util.spec_from_file_location(f"chatstream.domain.history_{ref.strip('.')}",
                                                  path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def conversation(exchanges: int) -> Any:
    """A new message's pending generation after ``exchanges`` questions, each answered."""
    from django.contrib.auth import get_user_model

    from chatstream.models import Conversation, Generation, Message

    user, _ = get_user_model().objects.get_or_create(username="bench-history")
    found = Conversation.objects.create(user=user, model=bp.MODEL)
    for i in range(exchanges):
        asked = Message.objects.create(conversation=found, role=Message.Role.USER,
                                       content=f"Question {i}, " * 10)
        reply = Generation.objects.create(conversation=found, user=user, prompt_message=asked,
                                          model=bp.MODEL, status=Generation.Status.COMPLETED,
                                          content=f"Answer {i}. " * 20)
        Message.objects.create(conversation=found, role=Message.Role.ASSISTANT,
                               content=reply.content, generation=reply)
    new = Message.objects.create(conversation=found, role=Message.Role.USER, content="Now?")
    return Generation.objects.select_related("prompt_message").get(pk=Generation.objects.create(
        conversation=found, user=user, prompt_message=new, model=bp.MODEL).pk)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default=".")
    parser.add_argument("--database", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--calls", type=int, default=300)
    options = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-history-"))
    if options.database == "sqlite":
        bp.DATABASE_URL = f"sqlite:///{workdir / 'bench.sqlite3'}"
        bp.migrate()
    else:
        bp.DB_NAME = "chatstream_bench_history"
        bp.DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{bp.DB_NAME}"
        bp.create_database()
    try:
        bp.setup_django()
        variants = {ref: history_at(ref, workdir) for ref in (options.before, options.after)}
        for exchanges in EXCHANGES:
            generation = conversation(exchanges)
            built = [v.build_history(generation) for v in variants.values()]
            assert built[0] == built[1], "the two commits send different histories"
            times: dict[str, list[float]] = {ref: [] for ref in variants}
            for _ in range(options.calls):
                for ref in random.sample(list(variants), len(variants)):
                    start = time.perf_counter()
                    variants[ref].build_history(generation)
                    times[ref].append(time.perf_counter() - start)
            before, after = (1000 * statistics.median(t) for t in times.values())
            print(f"{options.database}, {exchanges} exchanges before: {options.before} "
                  f"{before:.2f} ms, {options.after} {after:.2f} ms ({after / before:.2f}×)")
    finally:
        if options.database == "postgres":
            from django.db import connections

            connections.close_all()
            bp.drop_database()


if __name__ == "__main__":
    sys.exit(main())

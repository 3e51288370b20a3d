"""What a conversation search costs: ``chatstream.domain.search.search`` (PostgreSQL full-text
search over its GIN indexes; SQLite FTS5) against the simplest peer a user would write, an
``icontains`` over titles and messages, on the same 100,000 messages, in one run.

    .venv/bin/python bench/bench_search.py [--messages 100000] [--rounds 5]   # ~5 minutes

The data: 20 users, 4,000 conversations of 25 messages (user and assistant in turn), 5 to 120
words each, drawn from a 6,000-word vocabulary with Zipf's frequencies (a few words in most
messages, most words rare); the searched user holds 5% of them (200 conversations, 5,000
messages). The queries: common, middling and rare words, two words, a phrase, a word left out.
Each query is run once to warm the caches, then ``--rounds`` times, every kind of search in
turn; p50 and p95 are over every run of every query. PostgreSQL: the database
``chatstream_bench_search`` on 127.0.0.1:5432 (made and dropped here); SQLite: a temporary
file. Not a test.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PG_NAME = "chatstream_bench_search"
USERS, SHARE = 20, 0.05
PER_CONVERSATION = 25
VOCABULARY = 6000
QUERIES = ["the", "code", "python", "deploy", "kettle", "zebra", "python error",
           '"error handling"', "deploy -docker", "database or cache", "xylophone"]


def configure(sqlite_path: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "chatstream"],
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sqlite_path},
            "pg": {"ENGINE": "django.db.backends.postgresql", "NAME": PG_NAME,
                   "HOST": "127.0.0.1", "USER": "postgres"},
        },
        USE_TZ=True, DEFAULT_AUTO_FIELD="django.db.models.AutoField")
    django.setup()


def words() -> list[str]:
    """The vocabulary, commonest first: the queries' words at known ranks, made-up words after."""
    known = ["the", "a", "to", "and", "of", "is", "in", "it", "you", "that", "code", "error",
             "handling", "python", "data", "file", "database", "cache", "deploy", "docker"]
    made = [f"{a}{b}{c}" for a in "bcdfgklmnprstvz" for b in "aeiou" for c in
            ["lo", "ra", "ne", "ti", "mos", "ker", "sun", "dal", "pix", "tor", "vel", "qua",
             "zen", "fim", "rol", "gat", "bex"]][:VOCABULARY - len(known) - 2]
    return known + made[:2000] + ["kettle"] + made[2000:] + ["zebra"]


def make_data(total: int) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connections

    from chatstream.models import Conversation, Message

    rng = random.Random(7)
    vocabulary = words()
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    texts = [" ".join(rng.choices(vocabulary, weights, k=rng.randint(5, 120)))
             for _ in range(4000)]
    conversations = total // PER_CONVERSATION
    for alias in ("default", "pg"):
        users = [get_user_model().objects.db_manager(alias).create_user(f"user{i}")
                 for i in range(USERS)]
        chats = [Conversation(user=users[0] if i < conversations * SHARE else
                              users[1 + i % (USERS - 1)], title=" ".join(texts[i].split()[:5]))
                 for i in range(conversations)]
        Conversation.objects.using(alias).bulk_create(chats, batch_size=1000)
        messages = [Message(conversation=chat, role=("user", "assistant")[n % 2],
                            content=texts[rng.randrange(len(texts))])
                    for chat in chats for n in range(PER_CONVERSATION)]
        rng.shuffle(messages)  # the searched user's messages spread over the table
        Message.objects.using(alias).bulk_create(messages, batch_size=2000)
        if alias == "pg":
            with connections[alias].cursor() as cursor:
                cursor.execute("VACUUM ANALYZE")


def peer(user: Any, q: str, alias: str) -> list[Any]:
    """What a user would write: the query as one ``icontains``, titles and messages."""
    from django.db.models import Q

    from chatstream.models import Conversation

    return list(Conversation.objects.using(alias).filter(user=user)
                .filter(Q(title__icontains=q) | Q(messages__content__icontains=q))
                .distinct().order_by("-updated_at")[:20])


def measure(rounds: int) -> dict[tuple[str, str], list[float]]:
    from django.contrib.auth import get_user_model

    from chatstream.domain import search

    kinds = {
        "chatstream search": lambda user, q, alias: search.search(user, q, using=alias),
        "generic containment (other databases)":
            lambda user, q, alias: search.search(user, q, using=alias, generic=True),
        "peer: icontains": peer,
    }
    times: dict[tuple[str, str], list[float]] = {}
    for alias in ("pg", "default"):
        user = get_user_model().objects.db_manager(alias).get(username="user0")
        for q in QUERIES:
            for kind, run in kinds.items():
                run(user, q, alias)  # warm
                for _ in range(rounds):
                    started = time.perf_counter()
                    run(user, q, alias)
                    times.setdefault((alias, kind), []).append(
                        (time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import subprocess

    subprocess.run(["dropdb", "-h", "127.0.0.1", "-U", "postgres", "--if-exists", PG_NAME],
                   check=True)
    subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", PG_NAME], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        configure(os.path.join(tmp, "bench.sqlite3"))
        from django.core.management import call_command
        from django.db import connections

        for alias in ("default", "pg"):
            call_command("migrate", database=alias, verbosity=0)
        started = time.perf_counter()
        make_data(args.messages)
        print(f"data made in {time.perf_counter() - started:.0f} s; load average "
              f"{os.getloadavg()[0]:.1f}")
        times = measure(args.rounds)
        connections.close_all()
    subprocess.run(["dropdb", "-h", "127.0.0.1", "-U", "postgres", PG_NAME], check=True)
    print(f"\n{args.messages} messages, {len(QUERIES)} queries x {args.rounds} rounds, "
          f"ms per search\n")
    print("| database | search | p50 | p95 |\n|---|---|---:|---:|")
    for (alias, kind), ms in times.items():
        ms.sort()
        p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
        name = "PostgreSQL" if alias == "pg" else "SQLite"
        print(f"| {name} | {kind} | {statistics.median(ms):.1f} | {p95:.1f} |")


if __name__ == "__main__":
    main()

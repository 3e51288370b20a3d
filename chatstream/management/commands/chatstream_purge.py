"""Retention on demand: delete conversations nobody has touched for DAYS days, with everything
in them. The selection and the deletion are :mod:`chatstream.domain.retention`'s, which
``chatstream_sweep`` applies with ``CHATSTREAM_RETENTION_DAYS``: a conversation goes when it
has had no activity since the cutoff and nothing in it is live (no reply pending or streaming,
no tool call waiting for approval or running). Deletion runs in batches, each in its own
transaction, so memory and lock time stay bounded.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models.deletion import ProtectedError, RestrictedError
from django.utils import timezone

from chatstream.domain.retention import (
    counts,
    cutoff,
    delete_conversations,
    described,
    stale_conversations,
)

__all__ = ["Command", "stale_conversations"]


class Command(BaseCommand):
    help = (
        "Delete conversations with no activity in the last DAYS days, with their messages and "
        "generations. Prints what would be deleted unless --execute (or --yes) is given. "
        "CHATSTREAM_RETENTION_DAYS does the same on every chatstream_sweep."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", type=int, required=True, metavar="DAYS", dest="days",
                            help="Keep everything with activity in the last DAYS days.")
        parser.add_argument("--execute", "--yes", action="store_true", dest="execute",
                            help="Delete; without it, only count.")
        parser.add_argument("--batch-size", type=int, default=500, metavar="N",
                            help="Conversations deleted per transaction (default 500).")

    def handle(self, *args: Any, days: int, execute: bool, batch_size: int,
               **options: Any) -> None:
        if days < 1:
            raise CommandError(f"--older-than must be at least 1 (days); got {days!r}.")
        if batch_size < 1:
            raise CommandError(f"--batch-size must be at least 1; got {batch_size!r}.")
        since_when = cutoff(days, timezone.now())
        stale = stale_conversations(since_when)
        since = f"with no activity since {since_when:%Y-%m-%d %H:%M %Z}"
        if not execute:
            self.stdout.write(f"Dry run: would delete {described(counts(stale))} {since}. "
                              "Run again with --execute to delete them.")
            return
        try:
            deleted = delete_conversations(stale, batch_size=batch_size)
        except (ProtectedError, RestrictedError) as error:
            raise CommandError(
                "Stopped: another model protects rows of a conversation from deletion "
                f"({error.args[0]})."
            ) from error
        self.stdout.write(self.style.SUCCESS(f"Deleted {described(deleted)} {since}."))

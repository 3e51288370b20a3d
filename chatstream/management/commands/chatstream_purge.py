"""Retention: delete conversations nobody has touched for DAYS days, with everything in them.

The unit of deletion is the conversation. A generation is what an assistant message points
back to, and :func:`chatstream.domain.history.build_history` uses that link to build the
conversation sent upstream for the next reply, so deleting old generations out of a
conversation still in use would silently change what its next reply is based on. A
conversation goes when it has had no activity since the cutoff: ``updated_at`` older than the
cutoff, no message or generation created since, and no generation still pending or streaming.
Its messages and generations go with it (cascade). Deletion runs in batches, each in its own
transaction, so memory and lock time stay bounded.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.db.models.deletion import ProtectedError, RestrictedError
from django.utils import timezone

from chatstream.models import Conversation, Generation, Message


def stale_conversations(cutoff: Any) -> QuerySet[Conversation]:
    """Conversations with no activity since ``cutoff`` and nothing still running."""
    recent_generation = Generation.objects.filter(conversation=OuterRef("pk")).filter(
        Q(created_at__gte=cutoff) | Q(status__in=Generation.LIVE)
    )
    recent_message = Message.objects.filter(conversation=OuterRef("pk"), created_at__gte=cutoff)
    return (
        Conversation.objects.filter(updated_at__lt=cutoff)
        .exclude(Exists(recent_generation))
        .exclude(Exists(recent_message))
    )


class Command(BaseCommand):
    help = (
        "Delete conversations with no activity in the last DAYS days, with their messages and "
        "generations. Prints what would be deleted unless --execute (or --yes) is given."
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
        cutoff = timezone.now() - timedelta(days=days)
        stale = stale_conversations(cutoff)
        counts = {
            "conversations": stale.count(),
            "messages": Message.objects.filter(conversation__in=stale.values("pk")).count(),
            "generations": Generation.objects.filter(conversation__in=stale.values("pk")).count(),
        }
        described = (f"{counts['conversations']} conversation(s), {counts['messages']} "
                     f"message(s) and {counts['generations']} generation(s) with no activity "
                     f"since {cutoff:%Y-%m-%d %H:%M %Z}")
        if not execute:
            self.stdout.write(f"Dry run: would delete {described}. "
                              "Run again with --execute to delete them.")
            return
        deleted = {"conversations": 0, "messages": 0, "generations": 0}
        labels = {"chatstream.Conversation": "conversations", "chatstream.Message": "messages",
                  "chatstream.Generation": "generations"}
        while ids := list(stale.values_list("pk", flat=True)[:batch_size]):
            try:
                with transaction.atomic():
                    _total, per_model = Conversation.objects.filter(pk__in=ids).delete()
            except (ProtectedError, RestrictedError) as error:
                raise CommandError(
                    f"Stopped after {deleted['conversations']} conversation(s): another model "
                    f"protects rows of a conversation from deletion ({error.args[0]})."
                ) from error
            for label, count in per_model.items():
                if label in labels:
                    deleted[labels[label]] += count
        self.stdout.write(self.style.SUCCESS(
            f"Deleted {deleted['conversations']} conversation(s), {deleted['messages']} "
            f"message(s) and {deleted['generations']} generation(s) with no activity since "
            f"{cutoff:%Y-%m-%d %H:%M %Z}."
        ))

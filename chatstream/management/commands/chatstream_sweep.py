from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from chatstream.conf import conf
from chatstream.domain.retention import described
from chatstream.stream import sweep, sweep_retention


class Command(BaseCommand):
    help = (
        "Close generations whose worker died (no heartbeat for CHATSTREAM_STALE_AFTER seconds: "
        "interrupted, partial text kept) or that nobody streamed within "
        "CHATSTREAM_PENDING_TIMEOUT (cancelled), tool calls undecided for "
        "CHATSTREAM_APPROVAL_TIMEOUT (expired: the reply goes on) and tool calls whose worker "
        "died while they ran (lost); then, with CHATSTREAM_RETENTION_DAYS set, delete the "
        "conversations with no activity for that many days. Safe to run at any time, and "
        "repeatedly."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true",
            help="Change nothing: say what CHATSTREAM_RETENTION_DAYS would delete.")

    def handle(self, *args: Any, dry_run: bool = False, **options: Any) -> None:
        if not dry_run:
            counts = sweep()
            self.stdout.write(
                f"Interrupted {counts['interrupted']} stale stream(s); "
                f"cancelled {counts['abandoned']} never-started generation(s); "
                f"expired {counts['expired']} undecided tool call(s); "
                f"found {counts['lost']} tool call(s) lost with their worker."
            )
        retained = sweep_retention(dry_run=dry_run)
        if retained is None:
            self.stdout.write("Retention: CHATSTREAM_RETENTION_DAYS is None; nothing deleted.")
        elif dry_run:
            self.stdout.write(f"Dry run: retention ({conf.RETENTION_DAYS} days) would delete "
                              f"{described(retained)}; nothing changed.")
        else:
            self.stdout.write(f"Retention ({conf.RETENTION_DAYS} days): deleted "
                              f"{described(retained)}.")

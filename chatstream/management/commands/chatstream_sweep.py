from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from chatstream.stream import sweep


class Command(BaseCommand):
    help = (
        "Close generations whose worker died (no heartbeat for CHATSTREAM_STALE_AFTER seconds: "
        "interrupted, partial text kept) or that nobody streamed within "
        "CHATSTREAM_PENDING_TIMEOUT (cancelled), tool calls undecided for "
        "CHATSTREAM_APPROVAL_TIMEOUT (expired: the reply goes on) and tool calls whose worker "
        "died while they ran (lost). Safe to run at any time, and repeatedly."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        counts = sweep()
        self.stdout.write(
            f"Interrupted {counts['interrupted']} stale stream(s); "
            f"cancelled {counts['abandoned']} never-started generation(s); "
            f"expired {counts['expired']} undecided tool call(s); "
            f"found {counts['lost']} tool call(s) lost with their worker."
        )

"""``manage.py chatstream_simulator --port 8001``: the simulated upstream, in the foreground."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand

if TYPE_CHECKING:
    from django.core.management.base import CommandParser


class Command(BaseCommand):
    help = "Serve the simulated OpenAI-compatible upstream (chatstream.testing) until Ctrl-C."
    # The simulator stands in for a provider: it must start even while the site's own
    # chatstream settings are incomplete or wrong, so the system checks don't gate it.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        from chatstream.testing.__main__ import add_arguments

        add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        from chatstream.testing import Simulator

        def announce(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        simulator = Simulator(
            host=options["host"], port=options["port"], api_key=options["api_key"]
        )
        simulator.serve_forever(announce=announce)

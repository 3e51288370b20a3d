"""Make conversation search's index whole again (chatstream/domain/search_index.py).

On SQLite: the FTS5 tables and their triggers made where they are missing (a migration that
rebuilt the messages' or conversations' table dropped its triggers), and both tables refilled
from the rows. On PostgreSQL: the GIN indexes made again, with CHATSTREAM_SEARCH_CONFIG. On
other databases there is no index: nothing to do.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections

from chatstream.domain import search_index


class Command(BaseCommand):
    help = "Recreate conversation search's triggers (SQLite) or indexes (PostgreSQL), and " \
           "rebuild the index from the messages and titles."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS,
                            help="The database alias (default: %(default)s).")

    def handle(self, *args: Any, **options: Any) -> None:
        connection = connections[options["database"]]
        if connection.vendor not in ("sqlite", "postgresql"):
            self.stdout.write(f"{connection.vendor}: conversation search has no index here; "
                              "nothing to rebuild.")
            return
        with connection.schema_editor() as editor:
            search_index.rebuild(editor)
        self.stdout.write(self.style.SUCCESS(
            f"Conversation search's index rebuilt on {options['database']!r} "
            f"({connection.vendor})."))

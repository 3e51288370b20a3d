"""Import an export file (``chatstream-export``, see docs/export.md) as one user's history:
final statuses only, nothing that can run, no quota charge, whole or not at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from chatstream.domain.imports import MAX_BYTES, InvalidExport, import_export
from chatstream.domain.retention import described


class Command(BaseCommand):
    help = ("Import a chatstream export file (JSON) as USERNAME's history. The file's own "
            "user and ids are ignored; replies and tool calls that were live are ended.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path, help="The export file (JSON).")
        parser.add_argument("--user", required=True, metavar="USERNAME",
                            help="Whose history it becomes.")

    def handle(self, *args: Any, file: Path, user: str, **options: Any) -> None:
        users = get_user_model()._default_manager
        try:
            owner = users.get_by_natural_key(user)
        except users.model.DoesNotExist:
            raise CommandError(f"No user with username {user!r}.") from None
        try:
            size = file.stat().st_size
            if size > MAX_BYTES:
                raise CommandError(f"{file}: {size} bytes; the largest file accepted is "
                                   f"{MAX_BYTES}.")
            data = file.read_bytes()
        except OSError as error:
            raise CommandError(f"{file}: {error.strerror or error}.") from None
        try:
            imported = import_export(data, owner)
        except InvalidExport as error:
            raise CommandError(f"{file}: nothing imported: {error}") from None
        self.stdout.write(self.style.SUCCESS(
            f"Imported for {owner.get_username()!r}: {described(imported.counts)}."))

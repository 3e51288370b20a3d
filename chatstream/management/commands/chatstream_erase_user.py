"""Erasure: delete every row of chatstream that holds one user's words (their conversations,
messages, generations, tool calls, attempts and feedback), in batches, each in its own
transaction. Their live replies are stopped first. The user row stays (deleting it, which is
the site's to do, deletes the same rows through their foreign keys, and with them the quota
rows, which hold no text)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from chatstream.domain.retention import described, erase_user
from chatstream.stream import StopCause, stop_replies_of


class Command(BaseCommand):
    help = ("Delete all of one user's chatstream history (conversations, messages, replies, "
            "tool calls, attempts, feedback). Asks for the username unless --no-input.")

    def add_arguments(self, parser: CommandParser) -> None:
        who = parser.add_mutually_exclusive_group(required=True)
        who.add_argument("--username", help="The user's username.")
        who.add_argument("--id", type=int, dest="user_id", help="The user's id.")
        parser.add_argument("--no-input", "--noinput", action="store_false", dest="interactive",
                            help="Do not ask for confirmation.")
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS,
                            help="The database alias (default: default).")

    def handle(self, *args: Any, username: str | None = None, user_id: int | None = None,
               interactive: bool = True, database: str = DEFAULT_DB_ALIAS,
               **options: Any) -> None:
        users = get_user_model()._default_manager.db_manager(database)
        try:
            user = (users.get(pk=user_id) if user_id is not None
                    else users.get_by_natural_key(username))
        except users.model.DoesNotExist:
            raise CommandError(f"No user with {'id' if user_id is not None else 'username'} "
                               f"{user_id if user_id is not None else username!r}.") from None
        name = user.get_username()
        if interactive:
            try:
                typed = input(f"This deletes all chatstream history of {name!r} (id {user.pk}) "
                              "for good. Type the username to go on: ")
            except EOFError:  # no terminal to ask (cron, a pipe)
                raise CommandError("Not confirmed (no input to read; --no-input erases without "
                                   "asking): nothing was deleted.") from None
            if typed != name:
                raise CommandError("Not confirmed: nothing was deleted.")
        stop_replies_of(user, StopCause.DELETED)
        deleted = erase_user(user, using=database)
        self.stdout.write(self.style.SUCCESS(
            f"Erased the chatstream history of {name!r} (id {user.pk}): deleted "
            f"{described(deleted)}."))

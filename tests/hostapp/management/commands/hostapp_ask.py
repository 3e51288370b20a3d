"""``manage.py hostapp_ask alice "What are your opening hours?"``: ask the chat as a user."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from chatstream import api
from chatstream.exceptions import QuotaExceeded, RequestRefused
from chatstream.models import Generation


class Command(BaseCommand):
    help = "Ask the chat a question as a user, wait for the reply and print it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("text")
        parser.add_argument("--model", default=None, help="a key of CHATSTREAM_MODELS")

    def handle(self, *args: Any, username: str, text: str, model: str | None,
               **options: Any) -> None:
        try:
            user = get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"No user {username!r}.") from None
        try:
            generation = api.send(user, text, model=model)
        except (QuotaExceeded, RequestRefused) as refusal:
            raise CommandError(refusal.message) from None
        # Said at once: the reply can be watched (or stopped) on its page while it runs here.
        self.stdout.write(f"generation {generation.pk} "
                          f"{generation.conversation.get_absolute_url()}")
        self.stdout.flush()
        generation = api.run(generation)
        self.stdout.write(generation.content)
        self.stdout.write(f"status: {generation.status}")
        if generation.status != Generation.Status.COMPLETED:
            raise CommandError(f"The reply ended {generation.status}.")

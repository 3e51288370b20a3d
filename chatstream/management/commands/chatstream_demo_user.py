from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create (or reset) the demo login: a staff user 'demo' with password 'demo'. Demo only."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", default="demo")
        parser.add_argument("--password", default="demo")

    def handle(self, *args: Any, username: str, password: str, **options: Any) -> None:
        User = get_user_model()
        user, created = User.objects.get_or_create(defaults=None, **{User.USERNAME_FIELD: username})
        user.set_password(password)
        user.is_staff = user.is_superuser = True
        user.save()
        verb = "Created" if created else "Reset"
        self.stdout.write(f"{verb} the demo login {username!r} (password {password!r}).")

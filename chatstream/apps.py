from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ChatstreamConfig(AppConfig):
    name = "chatstream"
    verbose_name = _("Chat")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the system checks, and the quota's receiver of deleted generations.
        from . import checks, quota  # noqa: F401
        from .stream import connect_receivers

        connect_receivers()

from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings


class HostappConfig(AppConfig):
    name = "tests.hostapp"
    label = "hostapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A real site imports its receivers unconditionally. The test suite bills only where a
        # test asks for it (HOSTAPP_BILLING in a server's or a command's settings; a fixture in
        # the test process), so the rest of the suite runs with no receiver at all.
        if getattr(settings, "HOSTAPP_BILLING", False):
            from . import receivers  # noqa: F401

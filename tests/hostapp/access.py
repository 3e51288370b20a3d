"""Who may chat: ``CHATSTREAM_ACCESS = "tests.hostapp.access.chat_access"``."""

from __future__ import annotations

from typing import Any

INTERN_MODELS = ["fast"]


def chat_access(user: Any) -> bool | list[str]:
    """Banned users may not chat, interns may use the fast model only, others every model."""
    groups = set(user.groups.values_list("name", flat=True))
    if "banned" in groups:
        return False
    if "interns" in groups:
        return INTERN_MODELS
    return True

"""Request hooks for the signal and API tests (``CHATSTREAM_REQUEST_HOOKS`` names them)."""

from __future__ import annotations

from chatstream.exceptions import RequestRefused
from chatstream.hooks import RequestCall

REFUSAL = "Requests about that subject are not answered here."


def refuse(call: RequestCall) -> None:
    """Refuse every request, with a sentence for the user."""
    raise RequestRefused(REFUSAL)

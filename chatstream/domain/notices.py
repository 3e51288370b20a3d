"""The plain sentences that tell a user how a reply ended (one place, translated)."""

from __future__ import annotations

from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

CANCELLED, INTERRUPTED, FAILED = "cancelled", "interrupted", "failed"

# Replies stopped because their user lost the right to them (see stream/_revocation.py).
_USER_STOPPED = {
    "user_signed_out": gettext_lazy("Stopped: you signed out."),
    "user_deactivated": gettext_lazy("Stopped: your account was deactivated."),
    "access_revoked": gettext_lazy("Stopped: you no longer have access to the chat."),
}


def describe(status: str, *, error_type: str = "", http_status: int | None = None,
             has_content: bool = False, reason: str = "") -> str:
    """The sentence for a reply that ended with ``status`` ("" for a completed one);
    ``reason`` is the stored one, which for a request hook's refusal is the hook's sentence."""
    if status == CANCELLED:
        if error_type == "client_disconnected":
            return _("Stopped: the page was closed before the reply finished.")
        if error_type == "abandoned":
            return _("This reply was never started.")
        if error_type in _USER_STOPPED:
            return str(_USER_STOPPED[error_type])
        return _("Stopped by you.") if has_content else _("Stopped before any reply.")
    if status == INTERRUPTED:
        if error_type == "worker_lost":
            return _("Interrupted: the server stopped while writing this reply. "
                     "What arrived so far is kept; you can retry.")
        if error_type in ("reply_too_long", "max_tokens_exceeded"):
            return _("The reply was too long and was cut here. What arrived so far is kept.")
        return _("The reply was interrupted. What arrived so far is kept; you can retry.")
    if status == FAILED:
        if error_type == "refused" and reason:
            return reason
        if error_type == "hook_failed":
            return _("This request could not be sent. Please try again later.")
        return _failure(error_type, http_status or 0)
    return ""


def _failure(error_type: str, code: int) -> str:
    if code == 429:
        return _("The AI provider is busy right now. Please try again in a moment.")
    if code in (401, 403):
        return _("The chat service is not configured correctly. "
                 "Please let the site's administrators know.")
    if code >= 500:
        return _("The AI provider had a problem answering. Please try again.")
    if code >= 400:
        return _("The AI provider could not answer this request.")
    if error_type == "connect":
        return _("The AI provider could not be reached. Please try again later.")
    if error_type == "connect_timeout":
        return _("The AI provider did not answer. Please try again later.")
    if error_type == "cooling_down":
        return _("The AI provider has been failing, so this site paused its calls for a "
                 "moment. Please try again shortly.")
    if error_type == "model_not_allowed":
        return _("This model is no longer available. Please pick another one.")
    if error_type == "unsupported_encoding":
        return _("The AI provider answered in a form this site cannot read. "
                 "Please let the site's administrators know.")
    if error_type == "unsupported_server":
        return _("This site's server cannot stream replies. "
                 "Please let the site's administrators know.")
    return _("The reply failed. Please try again.")

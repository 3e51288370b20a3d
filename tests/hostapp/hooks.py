"""Request hooks: ``CHATSTREAM_REQUEST_HOOKS = ["tests.hostapp.hooks.refuse_passwords",
"tests.hostapp.hooks.add_faq"]``, called in that order for every new reply."""

from __future__ import annotations

from django.utils.translation import gettext as _

from chatstream.exceptions import RequestRefused
from chatstream.hooks import RequestCall

from .models import FaqEntry

FAQ_ENTRIES = 5


async def refuse_passwords(call: RequestCall) -> None:
    """Never send a password to a third party: refuse any message that mentions one."""
    if "password" in call.messages[-1]["content"].lower():
        raise RequestRefused(_("Please don't share passwords here. For a password reset, "
                               "use the Account page."))


def add_faq(call: RequestCall) -> None:
    """Add the site's FAQ to the system prompt (or as one, when there is none)."""
    entries = FaqEntry.objects.all()[:FAQ_ENTRIES]
    if not entries:
        return
    faq = "Answer from this FAQ when it applies:\n" + "\n".join(
        f"Q: {entry.question}\nA: {entry.answer}" for entry in entries)
    first = call.messages[0]
    if first["role"] == "system":
        first["content"] += "\n\n" + faq
    else:
        call.messages.insert(0, {"role": "system", "content": faq})

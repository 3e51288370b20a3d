"""What a page shows of a conversation: its exchanges, each a user message (one of its
versions) with a window of its replies. The conversation's page and the JSON API's
conversation read them here.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, QuerySet

from ..conf import conf
from ..domain import versions
from ..models import Conversation, Generation, Message
from . import windows
from .feedback import with_feedback
from .forms import EditForm


def transcript(conversation: Conversation, *, before: Message | None = None,
               showing: Message | None = None, replies_before: Generation | None = None
               ) -> tuple[list[dict[str, Any]], bool]:
    """A window of the conversation as exchanges (each current user message with its newest
    replies, and its versions: see :func:`exchange`), oldest first: the newest
    ``CONVERSATION_PAGE_SIZE`` ones, or those just before ``before``; and whether older ones
    exist. ``showing``, one version of one of them, is shown in its place, with its replies
    before ``replies_before`` when that is given. Two queries whatever the length, a third
    when the window holds an edited message, a fourth for ``showing``'s replies."""
    size = conf.CONVERSATION_PAGE_SIZE
    prompts = windows.exchanges(conversation)
    if before is not None:
        prompts = prompts.filter(windows.earlier_than(before))
    newest = Prefetch("generations", queryset=windows.newest_replies(_replies()),
                      to_attr="newest_replies")
    rows = list(prompts.order_by("-created_at", "-id").prefetch_related(newest)[:size + 1])
    window = rows[:size][::-1]
    edited = (versions.Versions.of(conversation.pk)
              if showing is not None or any(m.edit_of_id for m in window) else None)
    # Only the newest page ends with the message that may be edited.
    last = window[-1].pk if window and before is None else None
    exchanges = []
    for message in window:
        chain = edited.chain(message.pk) if edited is not None else [message.pk]
        if showing is not None and showing.pk in chain:
            exchanges.append(exchange(showing, chain, editable=showing.pk == last,
                                      replies_before=replies_before))
        else:
            exchanges.append(exchange(message, chain, editable=message.pk == last,
                                      newest=message.newest_replies))
    return exchanges, len(rows) > size


def _replies() -> QuerySet[Generation]:
    # What was sent upstream is never shown: not read either. Each reply's feedback (its
    # thumbs on the page) comes in the same query.
    return with_feedback(Generation.objects.defer("upstream_messages"))


def exchange(message: Message, chain: list[int], *, editable: bool = False,
             newest: list[Generation] | None = None,
             replies_before: Generation | None = None) -> dict[str, Any]:
    """What a page shows of one exchange: ``message`` (one of its versions, ``chain``, oldest
    first) with a window of its replies (``newest``, newest first as
    ``windows.newest_replies`` reads them, else read here in one query: the newest, or those
    before ``replies_before``) and the links to the others, where it stands among the
    versions, and whether it may be edited (``editable``: it is the conversation's last)."""
    at = chain.index(message.pk)
    editable = editable and at == len(chain) - 1  # an earlier version is not edited
    if newest is None:
        newest = list(windows.newest_replies(_replies().filter(prompt_message=message),
                                             before=replies_before))
    generations, earlier = windows.reply_window(newest)
    return {
        "message": message,
        "generations": generations,
        "earlier_replies": windows.replies_url(message, generations[0]) if earlier else "",
        "later_replies": (windows.replies_url(message, windows.later_replies(
            message, replies_before)) if replies_before is not None else ""),
        "versions": len(chain),
        "version": at + 1,
        "previous": chain[at - 1] if at > 0 else None,
        "next": chain[at + 1] if at + 1 < len(chain) else None,
        "current": chain[-1],
        "editable": editable,
        "edit_form": (EditForm(initial={"content": message.content},
                               auto_id=f"edit-{message.pk}-%s") if editable else None),
    }

"""A new message and its generation: the one path the page, the JSON API and
``chatstream.api`` all take.

In one transaction: the user's message, the generation, what it will send (the stored
conversation, then the request hooks, then the context budget) and the quota's admission. A
quota refusal rolls it all back (and ``quota_refused`` is sent), as does a Retry of a message
that has ``CHATSTREAM_MAX_REPLIES_PER_MESSAGE`` replies; a hook's refusal keeps the message and
a ``failed`` generation that says why (and ``generation_finished`` is sent).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import router, transaction
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from .. import hooks, quota
from ..conf import ModelChoice, conf
from ..exceptions import (
    ConversationFull,
    InvalidMessage,
    NotEditable,
    QuotaExceeded,
    ReplyStillLive,
    RequestRefused,
    TooManyReplies,
)
from ..models import Conversation, Generation, Message
from ..signals import quota_refused
from . import access, reporting, versions
from .history import after_step, build_history, fit

TITLE_LENGTH = 60


def send(user: Any, content: str, *, conversation: Conversation | None = None,
         model: str | None = None, request: HttpRequest | None = None) -> Generation:
    """Post ``content`` as ``user`` in ``conversation`` (a new one for None) and return the
    pending generation answering it.

    Raises InvalidMessage for an empty or too long message, PermissionDenied when the user may
    not chat, use ``model`` or write in ``conversation``, ConversationFull, QuotaExceeded
    (nothing kept) or RequestRefused (the message and the refused generation kept).
    """
    content = _checked(content)
    if conversation is not None and conversation.user_id != user.pk:
        raise PermissionDenied(_("This conversation is not yours."))
    choice = _model(user, model, conversation)
    if conversation is not None and is_full(conversation):
        raise ConversationFull(full_message())
    # A count read with counting_sent is spent here, as a message is about to be added; a
    # first message has no history before it to read.
    first = conversation is None or conversation.__dict__.pop(SENT, None) == 0

    def create() -> tuple[Generation, RequestRefused | None]:
        nonlocal conversation
        if conversation is None:
            conversation = Conversation.objects.create(user=user, model=choice.key)
        message = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                         content=content)
        created = _new_generation(conversation, message, choice.key, user=user,
                                  request=request, first=first)
        _touch(conversation, choice.key, title=conversation.title or title_from(content))
        return created

    return _admitted(create, user, request)


def edit(message: Message, content: str, *, model: str | None = None,
         request: HttpRequest | None = None) -> Generation:
    """Send ``content`` again in place of the user message ``message`` (the conversation's
    last, its reply ended) and return the pending generation answering the new version.

    The new version is a new message whose ``edit_of`` is ``message``: the earlier version
    and its replies are kept, and no longer sent upstream. The exceptions of :func:`send`;
    NotEditable when ``message`` may not be edited now.
    """
    content = _checked(content)
    conversation = message.conversation
    user = conversation.user
    choice = _model(user, model, conversation)
    if is_full(conversation):  # every version counts: each is a message sent
        raise ConversationFull(full_message())

    def create() -> tuple[Generation, RequestRefused | None]:
        # Locked, then checked: of two edits of one version at once, the second is refused.
        Message.objects.select_for_update().filter(pk=message.pk).first()
        if (why := versions.refusal(message)) is not None:
            raise NotEditable(why)
        new = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                     content=content, edit_of=message)
        created = _new_generation(conversation, new, choice.key, user=user, request=request)
        # A title taken from the edited message follows the edit.
        title = conversation.title
        _touch(conversation, choice.key,
               title=title_from(content) if title == title_from(message.content) else title)
        return created

    return _admitted(create, user, request)


def retry(original: Generation, *, model: str | None = None,
          request: HttpRequest | None = None) -> Generation:
    """A new pending generation answering ``original``'s question again: with ``model`` (one
    the user may use, else PermissionDenied), or ``original``'s model, or the user's default
    one when that is no longer theirs. ReplyStillLive while ``original`` is live; TooManyReplies
    when its message has ``MAX_REPLIES_PER_MESSAGE`` replies already."""
    original = last_step(original)  # a reply written in steps: its last step is repeated
    if original.is_live:
        raise ReplyStillLive(_("This reply is still being written."))
    user = original.user
    if model:
        choice: ModelChoice | None = _model(user, model, None)
    else:
        choice = access.model_for(user, original.model) or access.model_for(user, None)
    if choice is None:
        raise access.denied()
    message = original.prompt_message
    follows = original.follows

    def create() -> tuple[Generation, RequestRefused | None]:
        # Locked, then counted: of two Retries at once, the second counts the first's reply.
        Message.objects.select_for_update().filter(pk=message.pk).first()
        if replies_full(message):
            raise TooManyReplies(too_many_replies_message())
        return _new_generation(
            original.conversation, message, choice.key, user=user, request=request,
            retry_of=original, follows=follows,
            # From what that step was sent: the earlier steps' calls never run again.
            messages=after_step(follows, follows.calls.all()) if follows is not None else None)

    return _admitted(create, user, request)


def _checked(content: str) -> str:
    """``content`` stripped; InvalidMessage for none or too much."""
    content = content.strip()
    if not content:
        raise InvalidMessage(_("Write a message first."))
    if len(content) > conf.MAX_MESSAGE_LENGTH:
        raise InvalidMessage(_("A message may be at most %(limit)d characters long.")
                         % {"limit": conf.MAX_MESSAGE_LENGTH})
    return content


def _model(user: Any, model: str | None, conversation: Conversation | None) -> ModelChoice:
    """The model a message is sent with: ``model``, else the conversation's, else the
    default; PermissionDenied when the user may not use it (or not chat)."""
    choice = access.model_for(user, model)
    if not model and conversation is not None:  # the conversation's, else the default
        choice = access.model_for(user, conversation.model) or choice
    if choice is None:
        raise access.denied() if not access.may_chat(user) else PermissionDenied(
            _("This model is not available."))
    return choice


def _touch(conversation: Conversation, model: str, *, title: str) -> None:
    """A message was just sent in ``conversation``, with ``model``: its title, model and last
    activity say so."""
    conversation.title = title
    conversation.model = model
    conversation.updated_at = timezone.now()
    conversation.save(update_fields=["title", "model", "updated_at"])


def _admitted(create: Callable[[], tuple[Generation, RequestRefused | None]], user: Any,
              request: HttpRequest | None) -> Generation:
    """Run ``create`` in a transaction; then say what became of it."""
    try:
        with transaction.atomic(using=router.db_for_write(Generation)):
            generation, refusal = create()
    except QuotaExceeded as exceeded:
        reporting.send_robust(quota_refused, user=user, refusal=exceeded, request=request)
        raise
    if refusal is not None:  # committed, as a failed generation: the page shows why
        reporting.finished_now(generation)
        raise refusal
    return generation


def _new_generation(conversation: Conversation, message: Message, model: str, *, user: Any,
                    request: HttpRequest | None, retry_of: Generation | None = None,
                    follows: Generation | None = None,
                    messages: list[dict[str, Any]] | None = None, first: bool = False
                    ) -> tuple[Generation, RequestRefused | None]:
    """The pending generation, admitted; or, refused by a hook, the failed one and why. A
    later step of a reply (``follows``) is sent ``messages``; a first one, the history (none
    before the conversation's ``first`` message)."""
    generation = Generation(conversation=conversation, user=user, prompt_message=message,
                            model=model, retry_of=retry_of, follows=follows,
                            step=follows.step + 1 if follows is not None else 1)
    # What will be sent upstream is fixed now: the stream's start then reads no history.
    messages = build_history(generation, first=first) if messages is None else messages
    if conf.REQUEST_HOOKS:
        call = hooks.RequestCall(generation, user, request, messages)
        if (refused := hooks.refusal(call)) is not None:
            return _refused(generation, *refused)
        messages = fit(call.messages, model)
        generation.upstream_params = call.params
    generation.upstream_messages = messages
    generation.fallbacks = (list(follows.fallbacks) if follows is not None
                            else access.fallbacks_for(user, model))
    generation.save(force_insert=True)
    quota.admit(generation)  # raises QuotaExceeded, rolling back the caller's transaction
    return generation, None


def _refused(generation: Generation, refusal: RequestRefused, reason: str, error_type: str
             ) -> tuple[Generation, RequestRefused]:
    """Keep the refused generation, failed, with no upstream call and no quota hold."""
    generation.status = Generation.Status.FAILED
    generation.reason = reason
    generation.error_type = error_type
    generation.completed_at = timezone.now()
    for name, value in quota.cost_fields(generation).items():  # of nothing
        setattr(generation, name, value)
    generation.save(force_insert=True)
    refusal.generation = generation
    return generation, refusal


def title_from(content: str) -> str:
    line = " ".join(content.split())
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1].rstrip() + "…"


# The attribute a conversation read by :func:`counting_sent` holds its count in.
SENT = "messages_sent"


def counting_sent(conversations: QuerySet[Conversation]) -> QuerySet[Conversation]:
    """``conversations``, each read with the number of messages its user sent there, which
    :func:`is_full` and :func:`send` then take instead of a query of their own."""
    return conversations.annotate(**{SENT: Count("messages", filter=Q(
        messages__role=Message.Role.USER))})


def is_full(conversation: Conversation) -> bool:
    """Whether the user sent ``MAX_CONVERSATION_MESSAGES`` messages here already (one count,
    unless the conversation was read by :func:`counting_sent`; every version of an edited
    message counts, as each was sent)."""
    sent = getattr(conversation, SENT, None)
    if sent is None:
        sent = conversation.messages.filter(role=Message.Role.USER).count()
    return sent >= conf.MAX_CONVERSATION_MESSAGES


def replies_full(message: Message) -> bool:
    """Whether ``message`` has ``MAX_REPLIES_PER_MESSAGE`` replies (one count, every outcome).
    A reply written in steps counts once, and each Retry of one of its steps once more."""
    replies = message.generations.filter(Q(step=1) | Q(retry_of__isnull=False))
    return replies.count() >= conf.MAX_REPLIES_PER_MESSAGE


def last_step(generation: Generation) -> Generation:
    """The last step of the reply ``generation`` is a step of (itself, for a reply in one):
    the newest at each step, should a Retry have made several."""
    while (following := generation.followed_by.order_by("-created_at").first()) is not None:
        generation = following
    return generation


def too_many_replies_message() -> str:
    limit = conf.MAX_REPLIES_PER_MESSAGE
    return ngettext(
        "This message already has %(limit)d reply, the most it may have. Send it again as a "
        "new message to ask once more.",
        "This message already has %(limit)d replies, the most it may have. Send it again as a "
        "new message to ask once more.",
        limit,
    ) % {"limit": limit}


def full_message() -> str:
    limit = conf.MAX_CONVERSATION_MESSAGES
    return ngettext(
        "This conversation has reached its limit of %(limit)d message. Start a new "
        "conversation to continue.",
        "This conversation has reached its limit of %(limit)d messages. Start a new "
        "conversation to continue.",
        limit,
    ) % {"limit": limit}

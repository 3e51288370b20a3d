"""Who may chat, and with which models: ``CHATSTREAM_ACCESS`` (see docs/integration.md).

The callable gets the user and answers ``True`` (every allow-listed model), ``False`` (no
chat: chatstream's pages and JSON API answer 403) or the keys of the models this user may use
(an empty collection is ``False``). The answer narrows ``CHATSTREAM_MODELS``; a quota's
``models`` limit narrows it further when a message is admitted. It is asked on each page and
API call, and when a generation is created. A page or API call it refuses also stops the
user's live replies, wherever they run (:func:`refused`): a reply admitted before goes on only
while its user still may chat.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import wraps
from typing import Any, TypeVar

from django.core.exceptions import PermissionDenied
from django.utils.module_loading import import_string
from django.utils.translation import gettext as _

from .. import stream
from ..conf import ModelChoice, conf

F = TypeVar("F", bound=Callable[..., Any])

_ANSWER = "_chatstream_access"  # the callable's answer, kept on the user object it was given


def models_for(user: Any) -> list[ModelChoice]:
    """The allow-listed models ``user`` may use, in the settings' order; [] for no chat.

    The callable is asked once per user object (a request's ``request.user``), however many
    times a request asks: it may read the database.
    """
    choices = conf.model_choices()
    if not user.is_authenticated:
        return []
    if conf.ACCESS is None:
        return choices
    asked = user.__dict__.get(_ANSWER)
    if asked is None or asked[0] != conf.ACCESS:
        asked = user.__dict__[_ANSWER] = (conf.ACCESS, import_string(conf.ACCESS)(user))
    verdict: bool | Iterable[str] = asked[1]
    if verdict is True:
        return choices
    if not verdict:
        return []
    keys = {verdict} if isinstance(verdict, str) else set(verdict)
    return [choice for choice in choices if choice.key in keys]


def may_chat(user: Any) -> bool:
    return bool(models_for(user))


def model_for(user: Any, key: str | None) -> ModelChoice | None:
    """The model ``key`` if ``user`` may use it; for None or "", the default model if they may,
    else their first. None when the user may not use it."""
    choices = models_for(user)
    if not key:
        default = conf.get_model(None)
        if default is not None and default in choices:
            return default
        return choices[0] if choices else None
    return next((choice for choice in choices if choice.key == key), None)


def fallbacks_for(user: Any, key: str) -> list[str]:
    """The ``FALLBACKS`` of model ``key`` that ``user`` may use, with the same tools, in order
    (a quota plan narrows them further when the reply is admitted)."""
    model = conf.get_model(key)
    if model is None or not model.fallbacks:
        return []
    allowed = {choice.key: choice for choice in models_for(user)}
    return [fallback for fallback in dict.fromkeys(model.fallbacks)
            if fallback != key and fallback in allowed
            and allowed[fallback].tools == model.tools]


def denied() -> PermissionDenied:
    return PermissionDenied(_("You do not have access to the chat."))


def refused(user: Any) -> PermissionDenied:
    """The refusal of a signed-in ``user`` whom ``CHATSTREAM_ACCESS`` denies a page or an API
    call: their live replies are stopped (sync; see ``stream.stop_replies_of``)."""
    if user.is_authenticated:
        stream.stop_replies_of(user, stream.StopCause.ACCESS_REVOKED)
    return denied()


def chat_access_required(view: F) -> F:
    """Refuse (403) a signed-in user whom ``CHATSTREAM_ACCESS`` denies (a sync view), stopping
    their live replies."""

    @wraps(view)
    def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
        if not may_chat(request.user):
            raise refused(request.user)
        return view(request, *args, **kwargs)

    return wrapper  # type: ignore[return-value]

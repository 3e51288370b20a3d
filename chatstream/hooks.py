"""Request hooks (``CHATSTREAM_REQUEST_HOOKS``): a host site's say in what is sent upstream.

Each hook is called as ``hook(call)`` with a :class:`RequestCall`, in the settings' order, when
a generation is created (a message posted, a Retry, ``chatstream.api.send``), inside the
transaction that creates it, before the context budget and the quota's admission: what a hook
adds is counted, and is what gets sent. A hook may change ``call.messages`` and
``call.params`` in place, or refuse with ``RequestRefused("a sentence for the user")``. A hook
that raises anything else, or leaves the call invalid, refuses with a generic sentence, and
the traceback is logged (``chatstream.hooks``): a broken hook is never a 500 or a hung stream.
The log line never quotes the call (the user's text): the check below names what is wrong
without the values, and a hook's own exception message is logged at DEBUG only.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from django.http import HttpRequest
from django.utils.module_loading import import_string

from ._failures import log_failure
from .conf import conf
from .models import Generation

if TYPE_CHECKING:
    from .exceptions import RequestRefused

logger = logging.getLogger("chatstream.hooks")

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
# Request fields chatstream sets itself (the tools from the model's TOOLS): a hook's params
# cannot.
FIXED_PARAMS = frozenset({"model", "messages", "stream", "stream_options", "n", "tools",
                          "tool_choice"})
TOKEN_LIMITS = ("max_tokens", "max_completion_tokens")


@dataclass
class RequestCall:
    """One generation's request, as the hooks see it and may change it.

    ``generation`` is not saved yet (its ``pk``, ``conversation``, ``user``,
    ``prompt_message``, ``model`` and ``retry_of`` are set), except for a later step of a
    reply with tool calls (``step`` > 1: saved, waiting for this); ``request`` is the
    HttpRequest, or None from ``chatstream.api`` and for later steps; ``messages`` the
    ``{"role", "content"}`` dicts to send, the system prompt first and the new message last
    (for a later step, the assistant message with ``tool_calls`` and the ``tool`` messages of
    each step so far after it); ``params`` extra request fields (``temperature``...), on top
    of the model's ``PARAMS``.
    """

    generation: Generation
    user: Any
    request: HttpRequest | None
    messages: list[dict[str, str]]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def step(self) -> int:
        """Which upstream call of the reply this is: 1 for the answer to the user's message,
        then one more for each round of tool calls (their results are in ``messages``)."""
        return self.generation.step


class HookFailed(Exception):
    """A hook raised something other than RequestRefused, or left the call invalid."""


def run(call: RequestCall, max_tokens: int) -> None:
    """Call every hook on ``call``; RequestRefused passes through, anything else is
    HookFailed (logged here, with its traceback)."""
    from .exceptions import RequestRefused

    for path in conf.REQUEST_HOOKS:
        try:
            result = import_string(path)(call)
            if inspect.isawaitable(result):  # an async hook (a function, or a callable object)
                async_to_sync(_finish)(result)
            _check(call, max_tokens)
        except RequestRefused:
            raise
        except Exception as error:
            log_failure(logger, error, "Request hook %s failed for generation %s; the request "
                        "is refused", path, call.generation.pk)
            raise HookFailed(path) from error


async def _finish(awaitable: Awaitable[Any]) -> None:
    await awaitable


def _check(call: RequestCall, max_tokens: int) -> None:
    # The errors name what is wrong and where, never a value: the messages are the user's text,
    # and the params may hold it too.
    messages, params = call.messages, call.params
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"call.messages must be a non-empty list, not {_kind(messages)}.")
    for at, message in enumerate(messages):
        _check_message(at, message)
    if not isinstance(params, dict):
        raise ValueError(f"call.params must be a dict, not {_kind(params)}.")
    if fixed := FIXED_PARAMS & params.keys():
        raise ValueError(f"call.params cannot set {sorted(fixed)}: chatstream sets them.")
    for name in TOKEN_LIMITS:
        value = params.get(name)
        if value is not None and not (type(value) is int and 0 < value <= max_tokens):
            raise ValueError(f"call.params[{name!r}] must be a whole number from 1 to the "
                             f"model's {max_tokens}, not {_kind(value)}.")
    try:
        json.dumps(params)  # stored with the generation: must be JSON
    except (TypeError, ValueError):
        raise ValueError("call.params must hold JSON values only (strings, numbers, lists, "
                         "dicts, true, false, null).") from None


def _check_message(at: int, message: object) -> None:
    """One message in a shape chatstream sends: a role and its text; an assistant message
    with tool calls (its text may then be None); a ``tool`` message with the id it answers."""
    if not isinstance(message, dict):
        raise ValueError(f"call.messages[{at}] must be a dict, not {_kind(message)}.")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise ValueError(f"call.messages[{at}]['role'] must be one of {sorted(ROLES)}.")
    calls = message.get("tool_calls") if role == "assistant" else None
    if not isinstance(content, str) and not (calls and content is None):
        raise ValueError(f"call.messages[{at}]['content'] must be text, not {_kind(content)}.")
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise ValueError(f"call.messages[{at}]['tool_call_id'] must be text.")
    if calls is not None and not (isinstance(calls, list) and all(
            isinstance(call, dict) and isinstance(call.get("id"), str)
            and isinstance(call.get("function"), dict)
            and isinstance(call["function"].get("name"), str)
            and isinstance(call["function"].get("arguments"), str) for call in calls)):
        raise ValueError(f"call.messages[{at}]['tool_calls'] must be a list of calls, each "
                         "with an id, and a function's name and arguments as text.")


def _kind(value: object) -> str:
    """What ``value`` is, without what it says: its type's name (an int's value is no text)."""
    if type(value) is int:
        return str(value)
    return f"a {type(value).__name__}"


def refusal(call: RequestCall) -> tuple[RequestRefused, str, str] | None:
    """Run the request hooks on ``call`` (:func:`run`); if one refuses it (or fails), why,
    with the reason and error type a refused generation stores."""
    from .domain.notices import describe
    from .exceptions import RequestRefused

    choice = conf.get_model(call.generation.model)
    try:
        run(call, choice.max_tokens if choice else conf.MAX_TOKENS)
    except RequestRefused as refused:
        return refused, refused.message[:200], "refused"
    except HookFailed:
        return (RequestRefused(describe(Generation.Status.FAILED, error_type="hook_failed")),
                "a request hook failed", "hook_failed")
    return None

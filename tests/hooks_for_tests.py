"""A host site's request hooks and access callable, as the settings name them (dotted paths).

What each one does is set by the test through the module's state (``reset()`` before each
test): the callables run in whichever thread serves the request (the test's own, or the live
server's), all in this process.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chatstream.exceptions import RequestRefused
from chatstream.hooks import RequestCall

SYNC_HOOK = "tests.hooks_for_tests.sync_hook"
ASYNC_HOOK = "tests.hooks_for_tests.async_hook"
ACCESS = "tests.hooks_for_tests.access"
ASYNC_OBJECT_HOOK = "tests.hooks_for_tests.async_object_hook"

Action = Callable[[RequestCall], None]


@dataclass
class Seen:
    """What one hook call saw, copied when it was called (the call is changed afterwards)."""

    hook: str
    generation_pk: Any
    generation_model: str
    prompt: str
    user_pk: Any
    request: Any
    messages: list[dict[str, Any]]
    params: dict[str, Any]
    thread: str


@dataclass
class State:
    calls: list[Seen] = field(default_factory=list)
    sync_action: Action | None = None
    async_action: Action | None = None
    # username -> what access(user) answers; a user not named here may use every model.
    access: dict[str, Any] = field(default_factory=dict)
    access_calls: int = 0


state = State()
_lock = threading.Lock()


def reset() -> None:
    global state
    state = State()


def _seen(name: str, call: RequestCall) -> None:
    seen = Seen(name, call.generation.pk, call.generation.model,
                call.generation.prompt_message.content, getattr(call.user, "pk", None),
                call.request, [dict(m) for m in call.messages], dict(call.params),
                threading.current_thread().name)
    with _lock:
        state.calls.append(seen)


def sync_hook(call: RequestCall) -> None:
    _seen("sync", call)
    if state.sync_action is not None:
        state.sync_action(call)


async def async_hook(call: RequestCall) -> None:
    await asyncio.sleep(0)  # a real coroutine: it must be awaited, not merely called
    _seen("async", call)
    if state.async_action is not None:
        state.async_action(call)


class AsyncHook:
    """A hook that is an object whose ``__call__`` is a coroutine function."""

    async def __call__(self, call: RequestCall) -> None:
        await asyncio.sleep(0)
        _seen("async object", call)
        if state.async_action is not None:
            state.async_action(call)


async_object_hook = AsyncHook()


def access(user: Any) -> Any:
    with _lock:
        state.access_calls += 1
    return state.access.get(user.get_username(), True)


# --- actions a test gives the hooks ---------------------------------------------------------------


def add_system_text(text: str) -> Action:
    """Put ``text`` in a system message right after the site's own system prompt."""

    def act(call: RequestCall) -> None:
        lead = 1 if call.messages and call.messages[0]["role"] == "system" else 0
        call.messages.insert(lead, {"role": "system", "content": text})

    return act


def set_params(**params: Any) -> Action:
    def act(call: RequestCall) -> None:
        call.params.update(params)

    return act


def refuse(sentence: str) -> Action:
    def act(call: RequestCall) -> None:
        raise RequestRefused(sentence)

    return act


def explode(call: RequestCall) -> None:
    raise RuntimeError("the hook's own bug")

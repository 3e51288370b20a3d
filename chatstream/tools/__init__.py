"""Tools: the site's own functions, which a model may call.

``@tool`` declares one (:mod:`._declaring`); a model's ``CHATSTREAM_MODELS`` entry lists those
it may use under ``"TOOLS"`` (dotted paths, checked at startup); :mod:`._running` runs a
function with its timeout; :mod:`._calls` records a step's calls, runs each at most once and
says what the next upstream call is told of them.
"""

from __future__ import annotations

import functools
from typing import Any

from django.utils.module_loading import import_string

from ..conf import ModelChoice, conf
from ._calls import (
    FINAL,
    Asking,
    acancel_waiting,
    arecord,
    arun,
    as_dict,
    result_for_model,
    step_messages,
)
from ._declaring import DEFAULT_TIMEOUT, ArgumentsInvalid, Tool, ToolContext, ToolError, tool
from ._running import Outcome, execute

__all__ = [
    "DEFAULT_TIMEOUT",
    "FINAL",
    "ArgumentsInvalid",
    "Asking",
    "Outcome",
    "Tool",
    "ToolContext",
    "ToolError",
    "acancel_waiting",
    "arecord",
    "arun",
    "as_dict",
    "execute",
    "offered",
    "resolve",
    "result_for_model",
    "step_messages",
    "tool",
    "tools_of",
]


def resolve(path: str) -> Tool:
    """The tool at dotted ``path``; ImportError if nothing is there, TypeError if what is
    there was not declared with ``@tool``."""
    found = import_string(path)
    if not isinstance(found, Tool):
        raise TypeError(f"{path} is a {type(found).__name__}, not a function declared with "
                        "@tool.")
    return found


def tools_of(model: ModelChoice) -> dict[str, Tool]:
    """The tools ``model`` may call, by name (its ``TOOLS``, which the system checks vouch
    for)."""
    return {found.name: found for found in map(resolve, model.tools)}


def offered(model: ModelChoice, step: int) -> list[dict[str, Any]] | None:
    """The request's ``tools`` for ``step`` of a reply by ``model``: its tools' specs, or None
    when it has none or ``step`` is the last one (``CHATSTREAM_MAX_TOOL_STEPS``), which the
    model must answer in text."""
    if not model.tools or step >= conf.MAX_TOOL_STEPS:
        return None
    return _specs(model.tools)


@functools.lru_cache(maxsize=64)
def _specs(paths: tuple[str, ...]) -> list[dict[str, Any]]:
    return [resolve(path).spec() for path in paths]

"""A conversation's text in the shapes of the GenAI conventions (v1.41.0), for the spans of a
site that opted in (``CHATSTREAM_TELEMETRY_CONTENT``).

``gen_ai.input.messages`` and ``gen_ai.output.messages`` follow the conventions' input and
output message schemas (``role`` and ``parts``: ``text``, ``reasoning``, ``tool_call``,
``tool_call_response``, ``uri``), as JSON strings: the Python API holds no structured attribute
values. Nothing here runs unless a span records and the site opted in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson


def dumps(value: Any) -> str:
    """``value`` as the JSON of an attribute (any text kept as it is, not escaped).

    Made on the event loop, once per call, and as long as the conversation: orjson (about a
    third of the standard library's time: ~2 ms for a 200,000-character reply and 800 KB of
    prompt); the standard library only for what orjson refuses (a lone surrogate)."""
    try:
        return orjson.dumps(value, default=str).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def input_messages(messages: Iterable[Mapping[str, Any]]) -> str:
    """The Chat Completions ``messages`` sent upstream, as ``gen_ai.input.messages``."""
    converted = []
    for message in messages:
        role = str(message.get("role") or "user")
        if role == "tool":
            parts: list[dict[str, Any]] = [{
                "type": "tool_call_response", "id": str(message.get("tool_call_id") or ""),
                "response": message.get("content")}]
        else:
            parts = [*_content_parts(message.get("content")),
                     *map(_asked_call, message.get("tool_calls") or ())]
        converted.append({"role": role, "parts": parts})
    return dumps(converted)


def output_messages(text: str, reasoning: str, tool_calls: Sequence[Mapping[str, Any]],
                    finish_reasons: Sequence[str]) -> str:
    """The reply (choice 0) as ``gen_ai.output.messages``."""
    parts: list[dict[str, Any]] = []
    if reasoning:
        parts.append({"type": "reasoning", "content": reasoning})
    if text:
        parts.append({"type": "text", "content": text})
    parts.extend(_call(call) for call in tool_calls)
    finish = finish_reasons[0] if finish_reasons else "error"
    return dumps([{"role": "assistant", "parts": parts, "finish_reason": finish}])


def arguments(text: str) -> Any:
    """A tool call's arguments as the conventions want them: an object when they parse."""
    try:
        return orjson.loads(text) if text else {}
    except orjson.JSONDecodeError:
        return text


def _content_parts(content: Any) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts = []
    for part in content if isinstance(content, list) else [content]:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            parts.append({"type": "text", "content": part.get("text", "")})
        elif kind == "image_url":
            url = part.get("image_url")
            url = url.get("url", "") if isinstance(url, Mapping) else url
            parts.append({"type": "uri", "modality": "image", "uri": str(url or "")})
        else:
            parts.append({"type": str(kind or "unknown")})
    return parts


def _asked_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """A request's assistant ``tool_calls`` entry (``{"id", "function": {...}}``)."""
    function = call.get("function") or {}
    return _call({"id": call.get("id"), "name": function.get("name"),
                  "arguments": function.get("arguments")})


def _call(call: Mapping[str, Any]) -> dict[str, Any]:
    """A reply's tool call (``{"id", "name", "arguments"}``) as a ``tool_call`` part."""
    return {"type": "tool_call", "id": str(call.get("id") or ""),
            "name": str(call.get("name") or ""),
            "arguments": arguments(str(call.get("arguments") or ""))}

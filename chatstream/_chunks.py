"""Decode one ``chat.completion.chunk`` payload for :mod:`chatstream.completions`.

msgspec decodes the shapes every provider sends into small typed structs that skip the fields
never read; a payload of any other shape fails them and goes to :func:`lenient_chunk`, which
keeps the fields that have the right type. Also the exceptions for errors sent in the stream.
Pure Python, like the assembler (bench/README-parser.md has the measurements behind the choice).
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from chatstream.exceptions import MalformedChunkError, UpstreamStreamError, error_code

SNIPPET = 200  # characters of a bad payload kept on an exception (never in its message)

_T = TypeVar("_T")


class ChoiceFields(msgspec.Struct):
    """The fields of a ``choices`` entry that are read; the rest are skipped, never built."""

    index: int | None = None
    delta: dict[str, Any] | None = None
    finish_reason: str | None = None


class ChunkFields(msgspec.Struct):
    choices: list[ChoiceFields] | None = None
    usage: dict[str, Any] | None = None
    x_groq: dict[str, Any] | None = None
    error: Any = None  # an object, or a bare string (Ollama's native API)


class ChunkWithMeta(ChunkFields):
    id: str | None = None
    model: str | None = None
    system_fingerprint: str | None = None


# Typed decoders for the shapes every provider sends. A payload of any other shape (or not JSON, or
# "[DONE]") fails them: the caller sorts out "[DONE]" and blanks, and hands the rest to
# lenient_chunk.
decode_chunk = msgspec.json.Decoder(ChunkFields).decode
decode_chunk_with_meta = msgspec.json.Decoder(ChunkWithMeta).decode
decode_any = msgspec.json.Decoder().decode


def lenient_chunk(data: str) -> ChunkWithMeta:
    """Parse a payload the typed decoders refused, or raise :class:`MalformedChunkError`."""
    # The messages give the payload's size, never its text: it is the reply's (see exceptions.py).
    try:
        payload = decode_any(data)
    except msgspec.DecodeError:
        raise MalformedChunkError(
            f"The provider sent a stream payload that is not valid JSON ({len(data)} characters).",
            data=data[:SNIPPET],
        ) from None
    if payload.__class__ is not dict:
        raise MalformedChunkError(
            "The provider sent a stream payload that is JSON but not an object "
            f"({type(payload).__name__}, {len(data)} characters).",
            data=data[:SNIPPET],
        )
    # Keep each field that has the expected type, drop the others as unknown fields are dropped.
    choices = payload.get("choices")
    entries = None
    if choices.__class__ is list:
        entries = [
            ChoiceFields(
                _typed(entry.get("index"), int),
                _typed(entry.get("delta"), dict),
                _typed(entry.get("finish_reason"), str),
            )
            for entry in choices
            if entry.__class__ is dict
        ]
    return ChunkWithMeta(
        choices=entries,
        usage=_typed(payload.get("usage"), dict),
        x_groq=_typed(payload.get("x_groq"), dict),
        error=payload.get("error"),
        id=_typed(payload.get("id"), str),
        model=_typed(payload.get("model"), str),
        system_fingerprint=_typed(payload.get("system_fingerprint"), str),
    )


def _typed(value: object, kind: type[_T]) -> _T | None:
    """``value`` if it is exactly of ``kind`` (so no bool for int), else None."""
    return value if isinstance(value, kind) and value.__class__ is kind else None


def chunk_error(error: object) -> UpstreamStreamError:
    """The exception for a payload with a top-level ``error`` (an object or a bare string).

    Its message says so in our words, with the error's code if that is an identifier; the
    provider's own message (which may quote the prompt) is its ``detail``.
    """
    message: object = error
    code: object = None
    if isinstance(error, dict):
        message = error.get("message")
        code = error.get("code")
        if code is None:
            code = error.get("type")
    code = error_code(code)
    detail = message[:SNIPPET] if message and isinstance(message, str) else ""
    words = "The provider sent an error in the stream"
    return UpstreamStreamError(
        f"{words} ({code})." if code is not None else f"{words}.", code=code, detail=detail
    )


def event_error(data: str) -> UpstreamStreamError:
    """The exception for an ``event: error`` (its data may be JSON, or plain text)."""
    try:
        payload = decode_any(data)
    except msgspec.DecodeError:
        payload = None
    if isinstance(payload, dict):
        return chunk_error(payload.get("error") or payload)
    detail = data.strip()[:SNIPPET]
    if not detail:
        return UpstreamStreamError("The provider sent an error event with no details.")
    return UpstreamStreamError("The provider sent an error event.", detail=detail)

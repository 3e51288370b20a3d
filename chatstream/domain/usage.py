"""Token usage of a generation: the provider's figures when they arrive, an estimate otherwise.

An estimate is always labelled ``estimated`` and never presented as the provider's figure;
provider figures that are missing, negative or absurd are replaced by the estimate, never
trusted (and never credited back).
"""

from __future__ import annotations

from typing import Any

from ..models import Generation

Source = Generation.UsageSource


def estimate_tokens(text: str) -> int:
    """A rough token count (UTF-8 bytes / 4, rounded up), used only when the provider gives none."""
    return -(-len(text.encode("utf-8")) // 4) if text else 0


def message_text(message: Any) -> str:
    """What of one message sent upstream takes tokens: its text, and the names and arguments
    of the tool calls an assistant message carries (a ``tool`` message's result is its text)."""
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            text += f"{function.get('name') or ''}{function.get('arguments') or ''}"
    return text


# A reply is held to its request's max_tokens locally too, as a backstop for a provider that
# does not stop. Tokens can't be counted without the provider's tokenizer (and estimate_tokens
# undercounts CJK, ~1 token per 3-byte character, 3/4 of a token by its count), so the bound is
# in characters, and generous: 16 per token asked for, plus 64. Tokenizers average ~4
# characters per token on English and code and ~1 on CJK: an honest reply is cut only if it
# averages four times the sparsest natural text's characters per token, as only long runs of
# one repeated character could.
CHARACTERS_PER_TOKEN = 16


def characters_within(max_tokens: int) -> int:
    """The most characters one choice of a reply of ``max_tokens`` tokens is taken to hold."""
    return max_tokens * CHARACTERS_PER_TOKEN + 64


def provider_usage(usage: Any) -> dict[str, Any] | None:
    """The provider's usage as Generation fields, or None when missing or implausible."""
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31
               for v in (prompt, completion)):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if not (isinstance(cached, int) and not isinstance(cached, bool)
            and 0 <= cached <= prompt):  # type: ignore[operator]
        cached = None
    details = usage.get("completion_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
    if not (isinstance(reasoning, int) and not isinstance(reasoning, bool)
            and 0 <= reasoning <= completion):  # type: ignore[operator]
        reasoning = None
    return {"prompt_tokens": prompt, "completion_tokens": completion, "cached_tokens": cached,
            "reasoning_tokens": reasoning, "usage_source": Source.PROVIDER}


def usage_fields(usage: Any, *, prompt_estimate: int, generated: str) -> dict[str, Any]:
    """Generation usage fields: the provider's, else an estimate of the output (``generated``:
    the reply's text, reasoning and tool calls), else none. Reasoning tokens are only ever the
    provider's figure (``usage.completion_tokens_details.reasoning_tokens``)."""
    fields = provider_usage(usage)
    if fields is not None:
        return fields
    if generated:
        return {"prompt_tokens": prompt_estimate, "cached_tokens": None,
                "completion_tokens": estimate_tokens(generated), "reasoning_tokens": None,
                "usage_source": Source.ESTIMATED}
    return {"prompt_tokens": None, "cached_tokens": None, "completion_tokens": None,
            "reasoning_tokens": None, "usage_source": Source.NONE}

"""The reply as it grows: its text, its reasoning and its tool calls, what is still to send to
the page, and what each checkpoint and the final save write of it.

The pump (_pump.py) adds to it, the relay (_relay.py) sends what it has not sent, the
checkpointer (_checkpoints.py) writes it as it grows, the ending (_ending.py) saves it. Its
text is held once: ``text`` as of the last checkpoint and ``parts`` since, joined at each
checkpoint, so an open stream holds it as one string rather than as a list of small ones (which
cost ~60 bytes per delta). The reasoning (a reasoning model's thinking, choice 0's) is held
once too, by the accumulator, and read from there when it is written.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from ..completions import ChatCompletionAccumulator, compact
from ..domain.usage import usage_fields
from ..models import Generation
from . import _storable
from ._outcomes import Outcome


class Reply:
    """One generation's reply, as the provider has sent it so far."""

    # One per open stream: slots keep each a few hundred bytes instead of a dict.
    __slots__ = ("acc", "first_token_at", "parts", "reasoning_changed", "text", "unsent",
                 "unsent_reasoning")

    def __init__(self) -> None:
        self.acc = ChatCompletionAccumulator()
        self.text = ""  # as of the last checkpoint
        self.parts: list[str] = []  # the text since
        self.unsent: list[str] = []  # text the page has not been sent yet
        self.unsent_reasoning: list[str] = []  # reasoning the page has not been sent yet
        self.reasoning_changed = False  # since the last checkpoint
        self.first_token_at: datetime | None = None  # of the text, not of its reasoning

    # -- from the pump ---------------------------------------------------------------------------

    def add(self, text: str) -> None:
        """More of the reply's text."""
        self.parts.append(text)
        self.unsent.append(text)

    def add_reasoning(self, text: str) -> None:
        """More of its reasoning (the accumulator holds it; the page has not been sent it)."""
        self.unsent_reasoning.append(text)

    def read(self, *, grew: bool, reasoned: bool) -> None:
        """A network read has ended, which added text (``grew``) or reasoning (``reasoned``):
        tiny pieces are held as a few long strings."""
        if grew:
            if self.first_token_at is None:
                self.first_token_at = timezone.now()
            compact(self.parts)
            compact(self.unsent)
        if reasoned:
            compact(self.unsent_reasoning)
            self.reasoning_changed = True

    # -- for the relay -------------------------------------------------------------------------

    def take_unsent(self) -> str:
        """The text the page has not been sent yet, now counted as sent."""
        text = "".join(self.unsent)
        self.unsent.clear()
        return text

    def drop_unsent(self) -> None:
        """No page reads the reply any more: what it was not sent is dropped, not joined."""
        self.unsent.clear()
        self.unsent_reasoning.clear()

    def take_unsent_reasoning(self) -> str:
        """The reasoning the page has not been sent yet, now counted as sent."""
        text = "".join(self.unsent_reasoning)
        self.unsent_reasoning.clear()
        return text

    # -- for the checkpoints and the final save -------------------------------------------------

    def so_far(self) -> str:
        """The reply's text so far."""
        return self.text + "".join(self.parts) if self.parts else self.text

    def reasoning(self) -> str:
        """The reasoning so far, fitted to its column."""
        choice = self.acc.choices.get(0)
        return _storable.text(choice.reasoning) if choice is not None else ""

    def checkpoint_fields(self, *, heartbeat: bool) -> dict[str, Any] | None:
        """What the next checkpoint writes, or None when nothing is due; then ``text`` is the
        text it writes."""
        if not self.parts and not self.reasoning_changed and not heartbeat:
            return None
        fields: dict[str, Any] = {"heartbeat_at": timezone.now()}
        if self.parts:
            self.text += "".join(self.parts)
            self.parts.clear()
            fields["content"] = self.text
            fields["first_token_at"] = self.first_token_at
        if self.reasoning_changed:
            self.reasoning_changed = False
            fields["reasoning"] = self.reasoning()
        return fields

    def kept_fields(self, outcome: Outcome) -> dict[str, Any]:
        """How the reply ended and its text, fitted to their columns: what even a fallback save
        keeps (see store.finish_anyway)."""
        return _storable.fit(Generation, {
            "status": outcome.status,
            "reason": outcome.reason,
            "error_type": outcome.error_type,
            "content": self.so_far(),
            "reasoning": self.reasoning(),
            "first_token_at": self.first_token_at,
            "completed_at": timezone.now(),
            "heartbeat_at": None,
        })

    def final_fields(self, outcome: Outcome, *, model: str, prompt_estimate: int,
                     request_id: str, http_status: int | None) -> dict[str, Any]:
        """Every field of the final save, each fitted to its column whatever the provider sent
        (see _storable.py); ``model`` is the one asked for, the others what the call learnt."""
        fields = self.kept_fields(outcome)
        choice = self.acc.choices.get(0)
        calls = choice.tool_calls if choice else []
        provided: dict[str, Any] = {
            "finish_reason": (choice.finish_reason or "") if choice else "",
            "tool_calls": [{"id": c.id, "type": c.type, "name": c.name,
                            "arguments": c.arguments} for c in calls],
            "request_id": request_id,
            "http_status": http_status,
            "provider_model": self.acc.model or model,
        }
        generated = (fields["content"] + fields["reasoning"]
                     + "".join(c.name + c.arguments for c in calls))
        provided.update(usage_fields(self.acc.usage, prompt_estimate=prompt_estimate,
                                     generated=generated))
        fields.update(_storable.fit(Generation, provided))
        return fields

"""The one JSON form of each record the API returns.

Model output is text inside JSON strings, never HTML. What was sent upstream
(``upstream_messages``, ``upstream_params``) is never part of it. A generation's form is built
from its own fields alone: it is also what a stream's ``done`` event carries, rendered in the
final save's call, where no query may run (see ``Wire.render``). Its ``attempts`` are the one
exception: the views load them for every generation they answer with, in one query per answer
(:func:`with_attempts`), and the form reads what was loaded, never the database; where nothing
was (a stream's ``done`` event), they are null.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any, TypeVar

from django.db.models import Prefetch, prefetch_related_objects
from django.urls import reverse

from ..domain.notices import describe
from ..models import LOADED_ATTEMPTS, Attempt, Conversation, Feedback, Generation, Message
from ..web.feedback import NAMES

# Where a generation's attempts are loaded for its form (see with_attempts).
ATTEMPTS = LOADED_ATTEMPTS

G = TypeVar("G", bound=Iterable[Generation])


def when(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def attempts_prefetch() -> Prefetch:
    """What loads generations' attempts for :func:`generation`, in order (for a queryset's
    ``prefetch_related``)."""
    return Prefetch("attempts", queryset=Attempt.objects.order_by("number"), to_attr=ATTEMPTS)


def with_attempts(generations: G) -> G:
    """``generations`` with their attempts loaded, in one query for all of them (none for
    those that have them already)."""
    prefetch_related_objects(list(generations), attempts_prefetch())
    return generations


def attempt(a: Attempt) -> dict[str, Any]:
    return {
        "number": a.number,
        "model": a.model,
        "status": a.status,
        "http_status": a.http_status,
        "error_type": a.error_type,
        "retry_after": a.retry_after,
        "started_at": when(a.started_at),
        "first_token_at": when(a.first_token_at),
        "finished_at": when(a.finished_at),
    }


def generation(g: Generation) -> dict[str, Any]:
    loaded: list[Attempt] | None = getattr(g, ATTEMPTS, None)
    return {
        "id": str(g.pk),
        "conversation": str(g.conversation_id),
        "message": g.prompt_message_id,
        "status": g.status,
        "content": g.content,
        "reasoning": g.reasoning,
        "finish_reason": g.finish_reason,
        "error_type": g.error_type,
        "notice": describe(g.status, error_type=g.error_type, http_status=g.http_status,
                           has_content=bool(g.content), reason=g.reason),
        "model": g.model,
        "answered_by": g.answered_by or None,
        "attempts": None if loaded is None else [attempt(a) for a in loaded],
        "created_at": when(g.created_at),
        "started_at": when(g.started_at),
        "first_token_at": when(g.first_token_at),
        "completed_at": when(g.completed_at),
        "usage": {
            "prompt_tokens": g.prompt_tokens,
            "cached_tokens": g.cached_tokens,
            "completion_tokens": g.completion_tokens,
            "reasoning_tokens": g.reasoning_tokens,
            "source": g.usage_source,
        },
        # A decimal string, exact (null: the model has no price), in ``currency``.
        "cost": format(g.cost, "f") if g.cost is not None else None,
        "currency": g.currency or None,
        "retry_of": str(g.retry_of_id) if g.retry_of_id is not None else None,
        "step": g.step,
        "follows": str(g.follows_id) if g.follows_id is not None else None,
        "tool_calls_url": (reverse("chatstream:api-generation-tool-calls", args=[g.pk])
                           if g.tool_calls else None),
        "url": reverse("chatstream:api-generation", args=[g.pk]),
        "stream_url": reverse("chatstream:api-generation-stream", args=[g.pk])
        if g.is_live else None,
    }


def generation_text(g: Generation) -> str:
    """The generation as one line of JSON: the data of a stream's ``done`` event."""
    return json.dumps(generation(g), ensure_ascii=False, separators=(",", ":"))


def message(m: Message) -> dict[str, Any]:
    return {
        "id": m.pk,
        "conversation": str(m.conversation_id),
        "role": m.role,
        "content": m.content,
        "created_at": when(m.created_at),
    }


def conversation(c: Conversation) -> dict[str, Any]:
    return {
        "id": str(c.pk),
        "title": c.title,
        "model": c.model,
        "created_at": when(c.created_at),
        "updated_at": when(c.updated_at),
        "url": reverse("chatstream:api-conversation", args=[c.pk]),
        "messages_url": reverse("chatstream:api-messages", args=[c.pk]),
    }


def feedback(generation_id: Any, f: Feedback | None) -> dict[str, Any]:
    """A user's rating of a reply: ``rating`` "good", "bad" or null (not rated)."""
    return {
        "generation": str(generation_id),
        "rating": NAMES.get(f.rating) if f is not None else None,
        "comment": f.comment if f is not None else "",
        "updated_at": when(f.updated_at) if f is not None else None,
    }

"""A rich history for the export, import and erasure tests: every kind of row chatstream keeps
for a user, with text in every field that can hold it."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone

from chatstream.models import (
    Attempt,
    Conversation,
    Feedback,
    Generation,
    Message,
    QuotaAccount,
    QuotaCharge,
    ToolCall,
    UserQuota,
)

Status = Generation.Status


def user_in(alias: str, username: str = "alice") -> Any:
    return get_user_model().objects.db_manager(alias).create_user(username, password="pw")


def rich_history(user: Any, using: str = "default", *, title: str = "Trip to Lyon"
                 ) -> Conversation:
    """A conversation with an edited message, a retry, a reply in two steps with tool calls,
    attempts (a retry upstream), reasoning, costs, feedback; and the user's quota rows."""
    at = timezone.now() - timedelta(hours=1)

    def later(seconds: float) -> Any:
        return at + timedelta(seconds=seconds)

    conversation = Conversation.objects.using(using).create(
        user=user, title=title, model="fast", created_at=at, updated_at=later(60))

    def message(role: str, content: str, seconds: float, **fields: Any) -> Message:
        return Message.objects.using(using).create(conversation=conversation, role=role,
                                                   content=content, created_at=later(seconds),
                                                   **fields)

    def generation(prompt: Message, seconds: float, **fields: Any) -> Generation:
        fields.setdefault("status", Status.COMPLETED)
        return Generation.objects.using(using).create(
            conversation=conversation, user=user, prompt_message=prompt, model="fast",
            created_at=later(seconds), started_at=later(seconds + 0.1),
            first_token_at=later(seconds + 0.3), completed_at=later(seconds + 1), **fields)

    first = message("user", "# Forged heading\nHow far is Lyon?\r\n## Reply from evil", 1)
    failed = generation(first, 1.5, status=Status.FAILED, reason="upstream said 500",
                        error_type="http_error", http_status=500, content="")
    answer = generation(first, 2, retry_of=failed, content="About **470 km**.",
                        reasoning="Paris to Lyon by road.", prompt_tokens=12,
                        cached_tokens=2, completion_tokens=30, reasoning_tokens=8,
                        usage_source="provider", cost=Decimal("0.0001234567"),
                        currency="USD", finish_reason="stop", provider_model="fast-2025",
                        answered_by="fast", request_id="req-1")
    message("assistant", answer.content, 3, generation=answer)
    Attempt.objects.using(using).bulk_create([
        Attempt(generation=answer, number=1, model="fast", status="failed", http_status=429,
                error_type="rate_limited", retry_after=1.5, started_at=later(2)),
        Attempt(generation=answer, number=2, model="fast", status="succeeded",
                started_at=later(2.5), first_token_at=later(2.6), finished_at=later(3)),
    ])
    Feedback.objects.using(using).create(generation=answer, user=user, rating=1,
                                         comment="Right > wrong", created_at=later(4),
                                         updated_at=later(5))
    draft = message("user", "And by train?", 10)
    generation(draft, 11, content="Two hours.")
    edited = message("user", "And by train, from Paris?", 20, edit_of=draft)
    step = generation(edited, 21, content="Let me look.", finish_reason="tool_calls",
                      tool_calls=[{"id": "c1", "type": "function", "name": "timetable",
                                   "arguments": '{"from": "Paris"}'}])
    ToolCall.objects.using(using).create(
        generation=step, position=0, call_id="c1", name="timetable",
        arguments='{"from": "Paris"}', status=ToolCall.Status.SUCCEEDED,
        result="2h01, every hour", decided_by=user, decided_at=later(22),
        created_at=later(21.5), started_at=later(22), finished_at=later(23))
    last = generation(edited, 24, step=2, follows=step, content="About two hours by TGV.",
                      cost=Decimal("0.5"), currency="USD")
    message("assistant", last.content, 25, generation=last)
    QuotaAccount.objects.using(using).get_or_create(user=user)
    UserQuota.objects.using(using).get_or_create(user=user, defaults={"note": "vip"})
    for g in (failed, answer, step, last):
        QuotaCharge.objects.using(using).create(
            user=user, generation_id=g.pk, model="fast", at=g.created_at, prompt_estimate=10,
            max_tokens=100, reserved=110, charged=40, source="provider",
            settled_at=g.completed_at)
    return conversation

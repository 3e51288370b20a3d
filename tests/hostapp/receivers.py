"""Billing: one UsageCharge per finished reply (imported by HostappConfig.ready)."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from chatstream.models import Generation
from chatstream.signals import generation_finished

from .models import UsageCharge


@receiver(generation_finished, sender=Generation, dispatch_uid="hostapp.bill")
def bill(sender: type[Generation], generation: Generation, **kwargs: Any) -> None:
    # Runs on the streaming worker, in the background: one quick insert. get_or_create on
    # the unique generation_id keeps it to one row even if a generation were reported twice.
    UsageCharge.objects.get_or_create(generation_id=generation.pk, defaults={
        "user_id": generation.user_id,
        "model": generation.model,
        "status": generation.status,
        "prompt_tokens": generation.prompt_tokens,
        "completion_tokens": generation.completion_tokens,
    })

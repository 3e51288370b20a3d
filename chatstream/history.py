"""What is sent upstream for a generation: the conversation's stored text, never request input.

:func:`build_history` runs once, when a generation is created (the message view stores the
result in ``Generation.upstream_messages``); :func:`history` reads it back, and rebuilds it only
for rows made before that field existed.
"""

from __future__ import annotations

from .conf import conf
from .models import Generation, Message


def history(generation: Generation) -> list[dict[str, str]]:
    """The messages sent upstream for ``generation``, as stored when it was created."""
    return list(generation.upstream_messages) or build_history(generation)


def build_history(generation: Generation) -> list[dict[str, str]]:
    """The messages to send upstream for ``generation``: stored text only, never request input.

    Each earlier question is followed by the latest reply that produced text; replies to the
    question being answered now (earlier attempts) are left out. Called when a generation is
    created (its ``upstream_messages`` keep the result), and for rows made before that field.
    """
    prompt = generation.prompt_message
    messages: list[dict[str, str]] = []
    if conf.SYSTEM_PROMPT:
        messages.append({"role": "system", "content": conf.SYSTEM_PROMPT})
    stored = list(
        Message.objects.filter(conversation_id=generation.conversation_id,
                               created_at__lte=prompt.created_at)
        .select_related("generation")
        .order_by("created_at", "id")
    )
    replies: dict[int, Message] = {}
    for message in stored:
        if message.role == Message.Role.ASSISTANT and message.generation is not None:
            replies[message.generation.prompt_message_id] = message
    for message in stored:
        if message.role == Message.Role.USER and message.pk <= prompt.pk:
            messages.append({"role": "user", "content": message.content})
            reply = replies.get(message.pk)
            if reply is not None and message.pk != prompt.pk:
                messages.append({"role": "assistant", "content": reply.content})
    return messages

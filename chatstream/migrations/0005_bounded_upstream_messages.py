"""Trim what earlier versions stored in ``Generation.upstream_messages`` to the context budget.

Before 0005 every generation stored the whole conversation. Each row is cut as
``chatstream.domain.history.build_history`` now builds it: the system prompt and the last (new)
message kept always, then the newest whole turns that fit the budget of the row's model as
configured when this migration runs (``CHATSTREAM_MODELS[key]["CONTEXT_TOKENS"]``, else
``CHATSTREAM_CONTEXT_TOKENS``, else 16000). The estimate is copied here, not imported, so that
this migration keeps doing what it did when the app's code changes.

Pending rows are what matters: they are still to be sent. Finished rows are trimmed too, to
give back the space (a conversation's every message stays in its Message rows; the generation's
token counts keep the size of what was sent). Streaming rows are left as they are: their
stream already sent them, and the sweeper estimates an interrupted stream's prompt from them.

A row's estimate is never more than the length of its JSON text (each message's text is at
most 4 bytes a character, and its overhead less than its JSON punctuation), so only rows whose
text is longer than the smallest budget are read, in batches.
Reversing is a no-op: the cut text is still in the conversation.
"""

from django.conf import settings
from django.db import migrations
from django.db.models import TextField
from django.db.models.functions import Cast, Length

DEFAULT_BUDGET = 16000
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3
BATCH = 100


def _positive(value, default):
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else default


def _budgets():
    default = _positive(getattr(settings, "CHATSTREAM_CONTEXT_TOKENS", DEFAULT_BUDGET),
                        DEFAULT_BUDGET)
    models = getattr(settings, "CHATSTREAM_MODELS", {})
    own = {}
    if isinstance(models, dict):
        for key, entry in models.items():
            if isinstance(entry, dict):
                own[key] = _positive(entry.get("CONTEXT_TOKENS", default), default)
    return default, own


def _tokens(message):
    content = message.get("content") if isinstance(message, dict) else None
    text = content if isinstance(content, str) else ""
    return -(-len(text.encode("utf-8")) // 4) + MESSAGE_OVERHEAD


def _trimmed(messages, budget):
    """``messages`` cut to ``budget``, or None when they already fit (or are not a list)."""
    if not isinstance(messages, list) or len(messages) < 2:
        return None
    if REPLY_PRIMING + sum(_tokens(m) for m in messages) <= budget:
        return None
    first = messages[0]
    head = [first] if isinstance(first, dict) and first.get("role") == "system" else []
    last = messages[-1]
    turns = []
    for message in messages[len(head):-1]:
        if not turns or (isinstance(message, dict) and message.get("role") == "user"):
            turns.append([message])
        else:
            turns[-1].append(message)
    room = budget - REPLY_PRIMING - sum(_tokens(m) for m in [*head, last])
    kept = []
    for turn in reversed(turns):
        room -= sum(_tokens(m) for m in turn)
        if room < 0:
            break
        kept[:0] = turn
    return [*head, *kept, last]


def trim(apps, schema_editor):
    Generation = apps.get_model("chatstream", "Generation")
    default, own = _budgets()
    rows = (
        Generation.objects.using(schema_editor.connection.alias)
        .exclude(status="streaming")
        .annotate(stored_length=Length(Cast("upstream_messages", TextField())))
        .filter(stored_length__gt=min([default, *own.values()]))
        .only("pk", "model", "upstream_messages")
        .order_by("pk")
    )
    changed = []
    for row in rows.iterator(chunk_size=BATCH):
        cut = _trimmed(row.upstream_messages, own.get(row.model, default))
        if cut is not None:
            row.upstream_messages = cut
            changed.append(row)
        if len(changed) >= BATCH:
            Generation.objects.using(schema_editor.connection.alias).bulk_update(
                changed, ["upstream_messages"])
            changed = []
    if changed:
        Generation.objects.using(schema_editor.connection.alias).bulk_update(
            changed, ["upstream_messages"])


class Migration(migrations.Migration):

    dependencies = [
        ("chatstream", "0004_generation_upstream_messages"),
    ]

    operations = [
        migrations.RunPython(trim, migrations.RunPython.noop, elidable=True),
    ]

"""The end of a reply: its final save, and what comes after it.

The final save writes the outcome's fields (see _reply.py), the text rendered once for every
later reader (chatstream/web/rendered.py), what the reply cost (its usage priced by the quota,
at the answering model's price), the records of the reply's upstream calls (_attempts.py; those
a checkpoint has not written) and the quota hold settled (its settlement computed by the quota
from the outcome), in one transaction of the store. It cannot fail on provider data: every field
is fitted to its column (_storable.py), and the text shown is the text stored.
Should it fail all the same (the database refused it, its connection dropped), the outcome,
text and usage are saved on their own and the hold settled (``store.finish_anyway``).

:func:`after` is the one place that decides what follows a saved reply: today, telling the
site (chatstream/domain/reporting.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable
from typing import Any, TypeVar

from django.utils import timezone

from .. import quota, store
from .._failures import log_failure
from ..domain import reporting
from ..models import LOADED_ATTEMPTS, Generation
from ..web import rendered
from ._attempts import Attempts
from ._outcomes import Outcome
from ._wire import Render, Wire

logger = logging.getLogger("chatstream.lifecycle")

T = TypeVar("T", bytes, str)


async def save(generation: Generation, fields: Callable[[], dict[str, Any]],
               kept: Callable[[], dict[str, Any]], render: Render | None = None, *,
               attempts: Attempts | None = None) -> str:
    """Save ``fields()`` as ``generation``'s outcome, with the records of its upstream calls
    (``attempts``: those a checkpoint has not written); should that fail, what ``fields()``
    gave (or else ``kept()``) is saved as the module docstring says. Returns the generation's
    final form if ``render`` is given, ``""`` otherwise (or if rendering it fails after
    that)."""
    # What the log line and the JSON API's done event tell of them, without a query.
    setattr(generation, LOADED_ATTEMPTS, list(attempts.records) if attempts else [])
    unwritten = await attempts.unwritten() if attempts else []
    found: dict[str, Any] | None = None
    try:
        found = _priced(generation, fields())
        content = found.get("content", generation.content)
        final = await rendered.off_loop(len(content), _prepare, generation, found, render)
        await store.for_alias(generation._state.db).finish(generation, found,
                                                           _settlement(generation), unwritten)
        return final
    except Exception as error:  # the text is kept all the same; the row does not stay live
        log_failure(logger, error, "Generation %s: the final save failed; saving its "
                    "outcome and text alone", generation.pk)
    found = found if found is not None else _priced(generation, kept())
    for name, value in found.items():  # what the charge is computed from
        setattr(generation, name, value)
    await store.finish_anyway(generation, found, _settlement(generation), unwritten)
    if render is None:
        return ""
    try:
        return await rendered.off_loop(rendered.cost(generation), render, generation)
    except Exception as error:
        log_failure(logger, error, "Generation %s: the fallback save failed at rendering it",
                    generation.pk)
        return ""


def _priced(generation: Generation, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with the reply's ``cost`` and ``currency``, from the usage they give."""
    return {**fields, **quota.cost_fields(generation, fields)}


def _prepare(generation: Generation, fields: dict[str, Any], render: Render | None) -> str:
    """The outcome set on ``generation`` with its text rendered; its final form."""
    fields.update(rendered.fields(fields.get("content", generation.content)))
    for name, value in fields.items():
        setattr(generation, name, value)
    return render(generation) if render is not None else ""


def _settlement(generation: Generation) -> quota.Settlement | None:
    return None if generation.is_live else quota.settlement_for(generation)


def after(generation: Generation, outcome: Outcome) -> None:
    """What follows ``generation``'s saved reply, which ended with ``outcome``: the site is
    told (signals in the background, the log line)."""
    reporting.finished(generation)


async def refuse(generation: Generation, outcome: Outcome, wire: Wire[T]
                 ) -> AsyncGenerator[T, None]:
    """The stream of a claimed generation that may not run (its outcome says why): saved as
    such, without a provider call."""
    fields = {"status": outcome.status, "reason": outcome.reason,
              "error_type": outcome.error_type, "completed_at": timezone.now(),
              "heartbeat_at": None}
    final = await save(generation, lambda: fields, lambda: fields, wire.render)
    after(generation, outcome)
    yield await wire.error(outcome.notice)
    yield await wire.done(final)

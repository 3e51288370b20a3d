"""A user's live replies end when the user loses the right to them, in whichever process they run.

Each event is sent into Stop (see _stopping.py), never polled for: every live generation of the
user gets Stop's durable flag, written with the event as its cause, and Stop's channel message,
also carrying the cause. A reply that streams closes its upstream at once (without a channel
layer, at the stream's next checkpoint pass), keeps its text and settles its quota as for Stop,
stored as ``cancelled`` with a reason that names the event (``StopCause``); one nobody has
started yet is cancelled on the spot, with the same reason, and can never start.

What counts, exactly:

- **signed out**: Django's ``user_logged_out`` signal, which ``logout()`` and ``alogout()``
  send;
- **deactivated**: the user saved through the ORM with ``is_active`` False (``post_save``),
  once the save's transaction has committed. A queryset ``update()`` sends no signal: call
  ``chatstream.api.stop_replies_of(user)`` after one;
- **refused access**: chatstream refusing the user by ``CHATSTREAM_ACCESS`` on one of its
  pages or JSON API calls (``access.refused``), and ``chatstream.api.stop_replies_of(user)``,
  for a site that revokes access out of band;
- **deleted**: the user's generations are deleted with them (``CASCADE``), so no outcome can be
  stored; their streams are told to stop once the deletion commits, and without a channel
  layer the next checkpoint finds the row gone.

A password change is not among them (it ends the user's *other* sessions): it only cancels the
replies not started yet (see _tickets.py).

The work is synchronous, on the caller's thread and database connection (a view, a signal's
receiver: from async code, through ``sync_to_async``). The caller waits for the channel layer
as a Stop does, however many replies the user has: the messages of all of them go out together,
before and after the flags are written (as ``arequest_stop`` sends its one). A channel layer
that fails is logged, never raised (a sign-out must not fail for it): the flags stand.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any
from uuid import UUID

from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db import router, transaction
from django.db.models.signals import post_save, pre_delete

from .. import quota, store
from ..domain import reporting
from ..models import Generation
from . import _stopping
from ._outcomes import StopCause, stopped

logger = logging.getLogger("chatstream.stopping")


def stop_replies_of(user: Any, cause: StopCause) -> int:
    """Stop every live reply of ``user`` wherever it runs, stored as ``cause``; how many."""
    db = router.db_for_write(Generation, instance=user)
    found = list(Generation.objects.using(db).filter(
        user_id=user.pk, status__in=Generation.LIVE).values_list("pk", flat=True))
    if not found:
        return 0
    outcome = stopped(cause)
    _tell(found, cause)
    for generation_id in found:
        cancelled = store.request_stop(generation_id, reason=outcome.reason,
                                       error_type=outcome.error_type, settlement=quota.RELEASED,
                                       using=db)
        if cancelled is not None:  # nobody had started it: it ends here
            transaction.on_commit(partial(reporting.finished_now, cancelled), using=db)
    _tell(found, cause)
    return len(found)


astop_replies_of = sync_to_async(stop_replies_of)


def _tell(generation_ids: list[UUID], cause: str) -> None:
    """Stop's channel message to each of ``generation_ids``, all at once."""
    if _stopping.channel_layer() is None:
        return
    try:
        async_to_sync(_publish)(generation_ids, cause)
    except Exception:  # the durable flags carry the Stop all the same
        logger.warning("Could not send Stop (%s) over the channel layer; the replies stop at "
                       "their next checkpoint", cause, exc_info=True)


async def _publish(generation_ids: list[UUID], cause: str) -> None:
    await asyncio.gather(*(_stopping.publish(g, cause) for g in generation_ids))


# -- the events --------------------------------------------------------------------------------


def _signed_out(sender: Any, *, user: Any = None, **kwargs: Any) -> None:
    if user is not None and user.pk is not None:
        stop_replies_of(user, StopCause.SIGNED_OUT)


def _user_saved(sender: Any, *, instance: Any, created: bool = False,
                update_fields: Any = None, using: str | None = None, **kwargs: Any) -> None:
    if created or getattr(instance, "is_active", True):
        return
    if update_fields is not None and "is_active" not in update_fields:
        return
    # Once the deactivation is the database's: a rolled-back save stops nothing.
    transaction.on_commit(partial(stop_replies_of, instance, StopCause.DEACTIVATED),
                          using=using)


def _user_deleting(sender: Any, *, instance: Any, using: str | None = None,
                   **kwargs: Any) -> None:
    live = list(Generation.objects.using(using).filter(
        user_id=instance.pk, status=Generation.Status.STREAMING).values_list("pk", flat=True))
    if live:
        transaction.on_commit(partial(_tell, live, StopCause.DELETED), using=using)


def connect_receivers() -> None:
    """Listen for what ends a user's right to their replies (once, when the app is ready)."""
    user_model = get_user_model()
    user_logged_out.connect(_signed_out, dispatch_uid="chatstream.revocation.signed_out")
    post_save.connect(_user_saved, sender=user_model,
                      dispatch_uid="chatstream.revocation.user_saved")
    pre_delete.connect(_user_deleting, sender=user_model,
                       dispatch_uid="chatstream.revocation.user_deleting")

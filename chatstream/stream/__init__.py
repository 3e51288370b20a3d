"""The stream engine: one generation's life, from its claim to its saved outcome.

The data path runs one way: the provider's bytes -> ``SSEDecoder`` -> ``ChatCompletionAccumulator``
-> the run's text -> the browser's server-sent events, and checkpoints to the store. The views
and the ASGI front use what this module exports; the modules behind it are private:
``_entry`` (what opens, starts and stops a stream), ``_run`` (a generation's run, made of
``_reply``: the reply as it grows, ``_pump``: the provider's call, ``_relay``: the reply sent
to its pages, ``_ending``: its final save and what comes after), ``_bounds`` (how much of a
reply is read and kept), ``_checkpoints`` (the batched writes of every live stream),
``_stopping`` (Stop across processes), ``_revocation`` (what stops every reply of a user),
``_following`` (pages following a reply another request streams), ``_outcomes`` (how a run
ended), ``_wire`` (the events every client's wire shares; the page's wire is
chatstream/web/wire.py), ``_tickets`` (the signed stream URL and what ends it), ``_sweeper``
(streams left behind by a dead process) and ``_serving`` (whether this server can stream at
all).
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync

from .. import store
from . import _revocation, _tickets
from ._breaker import breaker
from ._entry import Claimed, aopen, arequest_stop, aresume, astart, release_request_connections
from ._following import TooManyFollowers
from ._outcomes import StopCause
from ._revocation import astop_replies_of, stop_replies_of
from ._run import Run
from ._serving import problem as serving_problem
from ._stopping import publish_watched
from ._sweeper import asweep, maybe_sweep_soon, sweep, sweep_retention
from ._tickets import PARAMETER as TICKET_PARAMETER
from ._tickets import issue as issue_ticket
from ._tickets import user_id as ticket_user_id
from ._wire import CONTENT_TYPE, HEADERS, PING, JsonWire, Render, Sent, TextWire, Wire, event

__all__ = [
    "CONTENT_TYPE",
    "HEADERS",
    "PING",
    "TICKET_PARAMETER",
    "Claimed",
    "JsonWire",
    "Render",
    "Run",
    "Sent",
    "StopCause",
    "TextWire",
    "TooManyFollowers",
    "Wire",
    "aopen",
    "arequest_stop",
    "aresume",
    "astart",
    "astop_replies_of",
    "asweep",
    "breaker",
    "connect_receivers",
    "event",
    "issue_ticket",
    "maybe_sweep_soon",
    "note_watched",
    "release_request_connections",
    "serving_problem",
    "stop_replies_of",
    "sweep",
    "sweep_retention",
    "ticket_user_id",
]


def note_watched(**lookup: Any) -> None:
    """A page now shows the streaming generations matching ``lookup`` (a reload, another tab):
    each carries on when the page that started it goes away. Sync, for a page's view."""
    watched = store.mark_watched(**lookup)
    if watched:
        async_to_sync(publish_watched)(watched)


def connect_receivers() -> None:
    """Listen for what ends a session or a user's right to chat (once, when the app is ready)."""
    _tickets.connect_receivers()
    _revocation.connect_receivers()

"""Who a stream request is from, by its session: what Django's ``SessionMiddleware`` and
``AuthenticationMiddleware`` would say, without their trips to a thread.

The ASGI front (chatstream/asgi.py) asks :func:`signed_in` for every stream request that carries
no valid ticket. Two ways answer it:

- **In one statement**, for the setup most sites run: database sessions and Django's
  ``ModelBackend``, the sessions, the users and the generations in one database. The session's
  row and the row of the generation's owner are read together (on PostgreSQL on the event loop,
  through the store's pool, with no thread; on other databases in one trip to a thread, without
  the ORM's query building, and the reply claimed for its owner in the same trip, where the
  store claims through Django's connection), and the owner is taken only when the session signs
  them in and every check of Django's ``get_user()`` passes as it stands: the session is
  unexpired, it names ``ModelBackend``, still listed in ``AUTHENTICATION_BACKENDS``, the user
  may authenticate (``ModelBackend.user_can_authenticate``: active), and the session's hash is
  the user's with the current ``SECRET_KEY`` (``get_session_auth_hash()``). (A user model whose
  default manager filters its rows, or with multi-table inheritance, and a session stored
  longer than 16 KB, are left to Django's code.)
- **Django's own code**, in one trip to a thread, for everything else: another session engine or
  backend, a hash only a fallback key verifies (Django then cycles the session: its new cookie is
  sent with the stream), ``SESSION_SAVE_EVERY_REQUEST``, a session that names nobody or someone
  other than the generation's owner, a generation that does not exist. The session store,
  ``get_user()``, then the middleware's response half for the cookie.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple
from uuid import UUID

from django.conf import settings
from django.contrib.auth import (
    BACKEND_SESSION_KEY,
    HASH_SESSION_KEY,
    SESSION_KEY,
    get_user,
    get_user_model,
)
from django.contrib.auth.backends import ModelBackend
from django.contrib.sessions.exceptions import SessionInterrupted
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.exceptions import ValidationError
from django.db import router
from django.db.models import Manager, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from .. import store
from .._loops import in_executor
from ..models import Generation
from ..stream import Claimed

Headers = list[tuple[bytes, bytes]]

_DATABASE_SESSIONS = "django.contrib.sessions.backends.db"
_MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"
# The longest stored session decoded on the loop (its signature, inflation and JSON cost time
# in proportion): a site's session is a few hundred characters; a longer one is decoded in the
# thread.
_DECODED_ON_THE_LOOP = 16_384
# What SessionMiddleware adds to a response whose request read the session.
_VARY_COOKIE: Headers = [(b"vary", b"Cookie")]


class SignedIn(NamedTuple):
    """Who a stream request is from, and what was done for them on the way."""

    user_id: Any  # the user the session signs in (None for nobody)
    headers: Headers  # what Django's SessionMiddleware would add to the response
    claimed: Claimed | None = None  # the generation's claim, when made on the way
    also: Any = None  # what ``also(user_id)`` gave, when it ran on the way


async def signed_in(request: HttpRequest, generation_id: UUID,
                    also: Callable[[Any], Any] | None = None) -> SignedIn:
    """Who the request's session signs in; the request is for a stream of the generation
    ``generation_id``. Where the session is read in one trip to a thread (see the module
    docstring), the generation is claimed for its owner and ``also(user_id)`` (sync, through
    Django's connection) runs in the same trip; ``claimed`` and ``also`` say what was done
    (None: not done here, the caller does it)."""
    key = request.COOKIES.get(settings.SESSION_COOKIE_NAME)
    if not key:
        return SignedIn(None, [])
    found = await _owner_signed_in(key, generation_id, also)
    if found.user_id is not None:
        return found
    user_id, headers = await in_executor(_by_django)(request)
    return SignedIn(user_id, headers)


async def _owner_signed_in(key: str, generation_id: UUID,
                           also: Callable[[Any], Any] | None = None) -> SignedIn:
    """The generation's owner when the session of ``key`` signs them in, read in one statement
    (on the loop on PostgreSQL, else in one trip to a thread, with the claim and ``also``) and
    checked as Django checks it; nobody, and nothing done, when Django's own code is to answer
    (see the module docstring): the session signs in someone else, or nobody, or the generation
    does not exist."""
    db = _direct_db()
    if db is None:
        return SignedIn(None, [])
    values = {"generation": generation_id, "key": key, "now": timezone.now()}
    reader = store.for_alias(db)
    if isinstance(reader, store.PostgresStore):
        # The claim follows on the loop, most often on the same connection: back to back,
        # the two statements take less than in one pipelined transaction (bench/README.md).
        user_id = _checked(db, await reader.rows(_owner_and_session, **values))
        return SignedIn(user_id, _VARY_COOKIE if user_id is not None else [])
    found: SignedIn = await in_executor(_read_and_claim)(db, values, also)
    return found


def _read_and_claim(db: str, values: dict[str, Any], also: Callable[[Any], Any] | None
                    ) -> SignedIn:
    """In one trip to a thread: the owner signed in, ``also``, then their generation claimed
    for them (through Django's connection, unless the store claims on PostgreSQL's loop): last,
    so that nothing failing after it leaves a claimed reply that no stream runs."""
    user_id = _checked(db, store.fetch(db, _owner_and_session, **values))
    if user_id is None:
        return SignedIn(None, [])
    also_gave = also(user_id) if also else None
    claimed = (None if isinstance(store.for_alias(), store.PostgresStore)
               else Claimed(store.claim(values["generation"], user_id)))
    return SignedIn(user_id, _VARY_COOKIE, claimed, also_gave)


def _checked(db: str, rows: list[tuple[Any, ...]]) -> Any:
    """The owner's id from the row of :func:`_owner_and_session`, if its session signs them
    in and every check of Django's ``get_user()`` passes; else None."""
    if not rows:
        return None  # no such generation: Django's answer (a 404)
    *columns, session_data = rows[0]
    if session_data is None or len(session_data) > _DECODED_ON_THE_LOOP:
        return None  # nobody, or a session whose decoding would hold the loop: Django's code
    from django.contrib.sessions.backends.db import SessionStore

    data = SessionStore().decode(session_data)
    backend, session_hash = data.get(BACKEND_SESSION_KEY), data.get(HASH_SESSION_KEY)
    if (backend != _MODEL_BACKEND or backend not in settings.AUTHENTICATION_BACKENDS
            or not session_hash or SESSION_KEY not in data):
        return None
    user_model = get_user_model()
    try:
        pk = user_model._meta.pk.to_python(data[SESSION_KEY])
    except ValidationError:
        return None
    user: Any = store.from_row(user_model, db, columns)
    if (user.pk != pk or not ModelBackend().user_can_authenticate(user)
            or not constant_time_compare(session_hash, user.get_session_auth_hash())):
        return None
    return user.pk


def _owner_and_session() -> QuerySet[Any]:
    """The owner of a generation, with the session of a key (if unexpired), in one statement:
    the user's columns and then the session's data (null for none)."""
    from django.contrib.sessions.models import Session

    meta = Session._meta
    session = Session.objects.filter(
        session_key=store.Slot("key", meta.pk),
        expire_date__gt=store.Slot("now", meta.get_field("expire_date")),
    ).values("session_data")
    owner = Generation.objects.filter(pk=store.Slot("generation", Generation._meta.pk))
    return (get_user_model()._default_manager.filter(pk__in=owner.values("user_id"))
            .annotate(cs_session=Subquery(session)))


def _direct_db() -> str | None:
    """The database a generation's owner and a session are read from in one statement, when
    the site's setup allows it: database sessions without SESSION_SAVE_EVERY_REQUEST, and the
    sessions, the users and the generations in one database."""
    if settings.SESSION_ENGINE != _DATABASE_SESSIONS or settings.SESSION_SAVE_EVERY_REQUEST:
        return None
    from django.contrib.sessions.models import Session

    user_model = get_user_model()
    # ModelBackend reads the user through the default manager: one that filters its rows (a
    # get_queryset() of its own) is asked by Django's code, and so is a user model whose
    # columns are not all in its own table (multi-table inheritance).
    manager = type(user_model._default_manager)
    if (manager.get_queryset is not Manager.get_queryset
            or any(f.model is not user_model for f in user_model._meta.concrete_fields)):
        return None
    db = router.db_for_read(Generation)
    if router.db_for_read(Session) != db or router.db_for_read(user_model) != db:
        return None
    return db


def _by_django(request: HttpRequest) -> tuple[Any, Headers]:
    """What the site's SessionMiddleware and AuthenticationMiddleware make of the request's
    session: Django's session store and ``get_user``, then the middleware's response half for
    the headers (a session verified with a fallback key is cycled: its new key must reach the
    browser)."""
    middleware = SessionMiddleware(_no_view)
    middleware.process_request(request)
    user = get_user(request)
    try:
        response = middleware.process_response(request, HttpResponse())
    except SessionInterrupted:  # deleted meanwhile (a logout elsewhere): Django answers
        return None, []
    headers = [(b"set-cookie", cookie.output(header="").strip().encode("latin-1"))
               for cookie in response.cookies.values()]
    if response.has_header("Vary"):
        headers.append((b"vary", response["Vary"].encode("latin-1")))
    return (user.pk if user.is_authenticated else None), headers


def _no_view(request: HttpRequest) -> HttpResponse:
    raise AssertionError("only the middleware's request and response halves are used")

"""Who a stream request is from, by its session (chatstream/web/sessions.py): the same answer as
Django's own ``get_user()``, read on the event loop where it can be (database sessions on
PostgreSQL) and by Django's code in a thread everywhere else."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.db import connections
from django.test import RequestFactory
from django.utils import timezone

from chatstream.models import Conversation, Generation, Message
from chatstream.stream import Claimed
from chatstream.web import sessions

from .workers import DATABASES, ROUTE_TO_POSTGRES

pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)

SCENARIOS = ["signed-in", "expired", "password-changed", "inactive", "backend-not-listed",
             "other-backend", "fallback-key", "no-such-session", "user-deleted", "no-user-in-it",
             "garbage", "large", "another-users-generation", "no-such-generation"]


@pytest.fixture(params=["postgres", "default"])
def alias(request: Any, settings: Any, require_service: Any) -> str:
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.db"
    if request.param == "postgres":
        require_service("PostgreSQL", lambda: "postgres" in DATABASES)
        settings.DATABASE_ROUTERS = [ROUTE_TO_POSTGRES]
    return str(request.param)


def generation_of(user: Any, alias: str) -> uuid.UUID:
    """A pending reply of ``user``'s, the generation a stream request names."""
    conversation = Conversation.objects.using(alias).create(user=user, model="fast")
    prompt = Message.objects.using(alias).create(
        conversation=conversation, role=Message.Role.USER, content="Hi")
    return Generation.objects.using(alias).create(
        conversation=conversation, user=user, prompt_message=prompt, model="fast").pk


def session_for(scenario: str, settings: Any, alias: str) -> tuple[str, Any, uuid.UUID]:
    """A session key made as a login makes it, then spoilt as ``scenario`` says; the id of
    the user Django's get_user() signs in with it (None for nobody); and the generation the
    stream request names (the user's own, unless the scenario says otherwise)."""
    user = get_user_model().objects.db_manager(alias).create_user(
        f"u-{scenario}", password="a password")
    generation = generation_of(user, alias)
    if scenario == "another-users-generation":
        # whose password's stored hash is the same string (users loaded from one fixture):
        # the session's hash would match theirs too
        someone_else = get_user_model().objects.db_manager(alias).create_user("someone-else")
        someone_else.password = user.password
        someone_else.save()
        generation = generation_of(someone_else, alias)
    elif scenario == "no-such-generation":
        generation = uuid.uuid4()
    session = SessionStore()
    session["_auth_user_id"] = str(user.pk)
    session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    session["_auth_user_hash"] = user.get_session_auth_hash()
    if scenario == "no-user-in-it":
        session = SessionStore()
        session["something"] = "else"
    elif scenario in ("backend-not-listed", "other-backend"):
        session["_auth_user_backend"] = "tests.test_sessions.OtherBackend"
        if scenario == "other-backend":
            settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS,
                                                "tests.test_sessions.OtherBackend"]
    elif scenario == "large":  # what a site may keep in its sessions: decoded in the thread
        session["cart"] = secrets.token_hex(20_000)
    session.create()
    key = session.session_key
    expected: Any = user.pk if scenario in ("signed-in", "fallback-key", "other-backend",
                                            "large", "another-users-generation",
                                            "no-such-generation") else None
    if scenario == "expired":
        Session.objects.using(alias).filter(session_key=key).update(
            expire_date=timezone.now() - timedelta(seconds=1))
    elif scenario == "password-changed":
        user.set_password("another")
        user.save()
    elif scenario == "inactive":
        user.is_active = False
        user.save()
    elif scenario == "fallback-key":
        settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
        settings.SECRET_KEY = "a rotated secret key " + "y" * 40
    elif scenario == "no-such-session":
        key = "x" * 32
    elif scenario == "user-deleted":
        user.delete()
    elif scenario == "garbage":
        Session.objects.using(alias).filter(session_key=key).update(session_data="garbage")
    return key, expected, generation


class CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor, counting the work sent to its threads."""

    submitted = 0

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(*args, **kwargs)


class OtherBackend:
    """A backend of the site's own: Django's code asks it, never the loop."""

    def get_user(self, user_id: Any) -> Any:
        return get_user_model()._default_manager.filter(pk=user_id).first()

    def authenticate(self, request: Any, **credentials: Any) -> None:
        return None


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_session_signs_in_whom_djangos_get_user_signs_in(scenario, alias, settings):
    key, expected, generation = session_for(scenario, settings, alias)
    request = RequestFactory().get("/", HTTP_COOKIE=f"{settings.SESSION_COOKIE_NAME}={key}")
    executor = CountingExecutor(max_workers=1)

    asked = []

    def also(user_id: Any) -> str:  # what a caller reads for the user, in the same trip
        asked.append(user_id)
        return "read"

    async def signed_in() -> Any:
        asyncio.get_running_loop().set_default_executor(executor)
        return await sessions.signed_in(request, generation, also)

    user_id, headers, claimed, read_too = asyncio.run(signed_in())
    assert user_id == expected
    on_postgres = connections[alias].vendor == "postgresql"
    status = Generation.objects.using(alias).filter(pk=generation).values_list(
        "status", flat=True).first()
    if scenario == "signed-in":  # the common case: one statement, on the loop on PostgreSQL
        assert executor.submitted == (0 if on_postgres else 1)
        if on_postgres:  # the stream claims it next, on the loop, and reads the rest
            assert claimed is None
            assert status == Generation.Status.PENDING
            assert (asked, read_too) == ([], None)
        else:  # claimed for its owner in the same trip to a thread, and the rest read
            assert claimed is not None and claimed.generation is not None
            assert claimed.generation.pk == generation
            assert claimed.generation.status == status == Generation.Status.STREAMING
            assert (asked, read_too) == ([expected], "read")
    else:
        # Django's own code decides, and nothing was claimed or read on the way
        nobody = asyncio.run(sessions._owner_signed_in(key, generation, also))
        assert nobody == sessions.SignedIn(None, [])
        assert claimed is None
        assert (asked, read_too) == ([], None)
        assert status != Generation.Status.STREAMING  # (a password change cancels it)
    if scenario == "fallback-key":  # Django cycled the session: the new key goes out
        assert any(name == b"set-cookie" for name, _ in headers), headers
    if expected is not None:
        assert (b"vary", b"Cookie") in headers


def test_a_reply_already_claimed_is_not_claimed_again_with_the_session(alias, settings):
    """A second request for the same reply (another tab, a reconnect) is signed in, and its
    claim finds the reply taken: it follows the stream rather than starting another."""
    key, expected, generation = session_for("signed-in", settings, alias)
    request = RequestFactory().get("/", HTTP_COOKIE=f"{settings.SESSION_COOKIE_NAME}={key}")
    first = async_to_sync(sessions.signed_in)(request, generation)
    second = async_to_sync(sessions.signed_in)(request, generation)
    assert first.user_id == second.user_id == expected
    if connections[alias].vendor != "postgresql":
        assert first.claimed is not None and first.claimed.generation is not None
        assert second.claimed == Claimed(None)


def test_what_fails_in_the_sessions_trip_leaves_the_reply_unclaimed(alias, settings):
    """A read made for the user in the same trip fails: the request fails, and its reply is
    still there to start (not claimed by a stream that will never run it)."""
    key, _expected, generation = session_for("signed-in", settings, alias)
    request = RequestFactory().get("/", HTTP_COOKIE=f"{settings.SESSION_COOKIE_NAME}={key}")

    def failing(user_id: Any) -> None:
        raise RuntimeError("the read made for the user failed")

    if connections[alias].vendor == "postgresql":  # no trip to a thread: nothing runs
        assert async_to_sync(sessions.signed_in)(request, generation, failing).also is None
    else:
        with pytest.raises(RuntimeError, match="failed"):
            async_to_sync(sessions.signed_in)(request, generation, failing)
    status = Generation.objects.using(alias).values_list("status", flat=True).get(pk=generation)
    assert status == Generation.Status.PENDING


def test_a_request_without_a_session_cookie_is_nobody_without_a_query(
        django_assert_num_queries):
    request = RequestFactory().get("/")
    with django_assert_num_queries(0):
        assert async_to_sync(sessions.signed_in)(request, uuid.uuid4()) == (None, [], None, None)

"""Who a stream request is from, by its session (chatstream/web/sessions.py): the same answer as
Django's own ``get_user()``, read on the event loop where it can be (database sessions on
PostgreSQL) and by Django's code in a thread everywhere else."""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.test import RequestFactory
from django.utils import timezone

from chatstream.web import sessions

from .workers import DATABASES

pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)

SCENARIOS = ["signed-in", "expired", "password-changed", "inactive", "backend-not-listed",
             "other-backend", "fallback-key", "no-such-session", "user-deleted", "no-user-in-it",
             "garbage", "large"]


class AuthToPostgres:
    """Sessions and users in the ``postgres`` database."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return "postgres" if model._meta.app_label in ("auth", "sessions") else None

    db_for_write = db_for_read

    def allow_relation(self, *args: Any, **hints: Any) -> bool:
        return True


@pytest.fixture(params=["postgres", "default"])
def alias(request: Any, settings: Any, require_service: Any) -> str:
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.db"
    if request.param == "postgres":
        require_service("PostgreSQL", lambda: "postgres" in DATABASES)
        settings.DATABASE_ROUTERS = ["tests.test_sessions.AuthToPostgres"]
    return str(request.param)


def session_for(scenario: str, settings: Any, alias: str) -> tuple[str, Any]:
    """A session key made as a login makes it, then spoilt as ``scenario`` says; and the id of
    the user Django's get_user() signs in with it (None for nobody)."""
    user = get_user_model().objects.db_manager(alias).create_user(
        f"u-{scenario}", password="a password")
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
                                            "large") else None
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
    return key, expected


class OtherBackend:
    """A backend of the site's own: Django's code asks it, never the loop."""

    def get_user(self, user_id: Any) -> Any:
        return get_user_model()._default_manager.filter(pk=user_id).first()

    def authenticate(self, request: Any, **credentials: Any) -> None:
        return None


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_session_signs_in_whom_djangos_get_user_signs_in(scenario, alias, settings):
    key, expected = session_for(scenario, settings, alias)
    request = RequestFactory().get("/", HTTP_COOKIE=f"{settings.SESSION_COOKIE_NAME}={key}")
    user_id, headers = async_to_sync(sessions.signed_in)(request)
    assert user_id == expected
    on_the_loop = async_to_sync(sessions._on_the_loop)(key)
    if alias == "postgres" and scenario == "signed-in":
        assert on_the_loop == expected  # no thread: the common case is read on the loop
    else:
        assert on_the_loop is None  # Django's own code decides
    if scenario == "fallback-key":  # Django cycled the session: the new key goes out
        assert any(name == b"set-cookie" for name, _ in headers), headers
    if expected is not None:
        assert (b"vary", b"Cookie") in headers


def test_a_request_without_a_session_cookie_is_nobody_without_a_query(
        django_assert_num_queries):
    request = RequestFactory().get("/")
    with django_assert_num_queries(0):
        assert async_to_sync(sessions.signed_in)(request) == (None, [])

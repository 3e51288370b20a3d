"""Test settings: the demo site's, with a file-based SQLite test database.

A file (not ``:memory:``) because the end-to-end tests serve the app from other threads and
processes, which must all see the same database. ``CHATSTREAM_TEST_POSTGRES`` (a URL) adds a
``postgres`` alias for the tests that need real concurrency.
"""

import os
import tempfile
from pathlib import Path

# The demo's settings refuse to run with DEBUG off and no key of the site's own, and send
# plain HTTP to HTTPS: the tests (and the server processes they start, which inherit this
# environment) have a key of their own and speak plain HTTP.
os.environ.setdefault("DJANGO_SECRET_KEY", "tests-only-" + "k" * 50)
os.environ.setdefault("DJANGO_HTTPS", "0")

from project.settings import *  # noqa: F403
from project.settings import DATABASES, _database

_TMP = Path(os.environ.get("CHATSTREAM_TEST_TMP", tempfile.gettempdir()))
DATABASES["default"]["TEST"] = {"NAME": str(_TMP / f"chatstream-test-{os.getpid()}.sqlite3")}



def _postgres_answers(url: str) -> bool:
    try:
        import psycopg
    except ImportError:
        return False
    try:
        psycopg.connect(url, connect_timeout=2).close()
    except psycopg.Error:
        return False
    return True


# The alias exists only when the server answers, so a machine without PostgreSQL still runs the
# rest of the suite; the tests that need it skip (or fail, with CHATSTREAM_REQUIRE_SERVICES=1).
if os.environ.get("CHATSTREAM_TEST_POSTGRES") and _postgres_answers(
    os.environ["CHATSTREAM_TEST_POSTGRES"]
):
    DATABASES["postgres"] = _database(os.environ["CHATSTREAM_TEST_POSTGRES"])
    DATABASES["postgres"]["TEST"] = {"NAME": f"test_chatstream_{os.getpid()}"}

# An example host site (docs/integration.md); its hooks and access are off unless a test asks.
INSTALLED_APPS = [*INSTALLED_APPS, "tests.hostapp"]  # noqa: F405
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
CHATSTREAM_SWEEP_INTERVAL = 0  # tests run the sweeper explicitly
LOGGING = {"version": 1, "disable_existing_loggers": False}

# Sessions in signed cookies: a login made here is valid in every server process the tests
# start, whatever database that process uses.
SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"

# Worker processes started by tests receive their settings overrides as JSON.
if os.environ.get("CHATSTREAM_TEST_OVERRIDES"):
    import json

    globals().update(json.loads(os.environ["CHATSTREAM_TEST_OVERRIDES"]))

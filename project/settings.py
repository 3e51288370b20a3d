"""Settings of the chatstream demo site.

Everything a deployment changes comes from the environment:

- ``CHATSTREAM_BASE_URL``, ``CHATSTREAM_API_KEY``, ``CHATSTREAM_MODEL``: a real provider
  (default: the simulated upstream at ``CHATSTREAM_SIMULATOR_URL``, http://127.0.0.1:8001/v1).
- ``DATABASE_URL``: ``postgres://user@host:port/name`` (default: SQLite in db.sqlite3).
- ``REDIS_URL``: ``redis://host:port/db`` for a channels_redis layer, so Stop works across
  worker processes (default: the in-memory layer, one process).
- ``DJANGO_DEBUG``: ``1`` for development (``make demo`` sets it); off by default.
- ``DJANGO_SECRET_KEY``: required with DEBUG off, and never the demo's public key, which
  anyone can use to forge sessions and stream tickets (with DEBUG on, that key is the default).
- ``DJANGO_ALLOWED_HOSTS``: comma-separated host names (default: 127.0.0.1, localhost, testserver).
- ``DJANGO_HTTPS``: the site is served over HTTPS behind a proxy that sets
  ``X-Forwarded-Proto``: HTTP is redirected, cookies are secure, HSTS is sent (default: on when
  DEBUG is off). ``DJANGO_HSTS_SECONDS`` (default a year, with subdomains and preload, as
  ``check --deploy`` asks) can start lower while trying it out.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def _flag(name: str, *, default: bool) -> bool:
    """The environment variable ``name`` as a boolean (1/0, true/false, yes/no, on/off)."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ImproperlyConfigured(f"{name} must be 1 or 0, not {value!r}.")
    return value in ("1", "true", "yes", "on")


DEBUG = _flag("DJANGO_DEBUG", default=False)

_DEMO_SECRET_KEY = "demo-only-not-secret-change-me"
_HOW_TO_SET_KEY = (
    "Set DJANGO_SECRET_KEY to 50 or more random characters, kept secret (for example the output "
    "of: python -c 'import secrets; print(secrets.token_urlsafe(50))'), or set DJANGO_DEBUG=1 "
    "to run the demo on this machine, as `make demo` does.")

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY.strip():
    if not DEBUG:
        raise ImproperlyConfigured(
            f"DJANGO_SECRET_KEY is not set, and DEBUG is off: the site needs a secret key of "
            f"its own. {_HOW_TO_SET_KEY}")
    SECRET_KEY = _DEMO_SECRET_KEY
elif SECRET_KEY == _DEMO_SECRET_KEY and not DEBUG:
    raise ImproperlyConfigured(
        f"DJANGO_SECRET_KEY is the demo's public key {SECRET_KEY!r}: with it anyone can forge "
        f"sessions and stream tickets, so it is refused while DEBUG is off. {_HOW_TO_SET_KEY}")

ALLOWED_HOSTS = [host.strip() for host in os.environ.get(
    "DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",") if host.strip()]

if _flag("DJANGO_HTTPS", default=not DEBUG):
    # TLS ends at the proxy (docs/deployment.md), which must set this header on every request.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS", "31536000"))  # a year
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "chatstream",
]

try:  # daphne first: `manage.py runserver` then serves ASGI and streams (demo only).
    import daphne  # noqa: F401

    INSTALLED_APPS.insert(0, "daphne")
except ImportError:
    pass

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The page in the visitor's language (Accept-Language), among LANGUAGES: chatstream ships
    # German, French and Spanish (docs/languages.md).
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

try:  # Django 6.0+: a strict Content-Security-Policy (chatstream needs no inline script).
    from django.utils.csp import CSP

    MIDDLEWARE.append("django.middleware.csp.ContentSecurityPolicyMiddleware")
    SECURE_CSP = {
        "default-src": [CSP.SELF],
        "script-src": [CSP.SELF],
        "style-src": [CSP.SELF],
        "img-src": [CSP.SELF, "data:"],
        "connect-src": [CSP.SELF],
        "object-src": [CSP.NONE],
        "base-uri": [CSP.NONE],
        "frame-ancestors": [CSP.NONE],
        "form-action": [CSP.SELF],
    }
except ImportError:  # Django 5.2: set the header in your web server instead.
    pass

ROOT_URLCONF = "project.urls"
ASGI_APPLICATION = "project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The demo site's own templates come first: that is how it overrides the app's.
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database(url: str | None) -> dict[str, object]:
    """DATABASES["default"] from DATABASE_URL: postgres://… or sqlite:///path (default: SQLite)."""
    parts = urlsplit(url or "")
    if parts.scheme not in ("", "sqlite", "postgres", "postgresql"):
        raise ImproperlyConfigured(
            f"DATABASE_URL must start with postgres:// or sqlite:///, not {parts.scheme}://")
    if parts.scheme in ("", "sqlite"):
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": parts.path[1:] or os.environ.get("SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
            # WAL and a busy timeout: concurrent posts wait instead of "database is locked".
            # synchronous=NORMAL (durable in WAL mode but for the last transactions before a
            # power loss): streams start ~2 ms sooner (bench/README.md, "Every start in front
            # of Django"). SQLITE_SYNCHRONOUS and CONN_MAX_AGE are there to measure others.
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE",
                        "init_command": "PRAGMA journal_mode=WAL;" + _synchronous()},
            "CONN_MAX_AGE": _conn_max_age(0),
        }
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        # A connection pool (psycopg_pool): a new PostgreSQL connection costs ~10 ms of CPU,
        # and every stream touches the database at its start and end. DATABASE_POOL_SIZE=0
        # turns it off (then every request opens its own connection).
        "CONN_MAX_AGE": 0,
        "OPTIONS": _pool_options(int(os.environ.get("DATABASE_POOL_SIZE", "20"))),
        "TEST": {"NAME": os.environ.get("TEST_DATABASE_NAME")},
    }


def _synchronous() -> str:
    level = os.environ.get("SQLITE_SYNCHRONOUS", "NORMAL").upper()
    if level not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise ImproperlyConfigured("SQLITE_SYNCHRONOUS must be OFF, NORMAL, FULL or EXTRA")
    return f" PRAGMA synchronous={level};"


def _conn_max_age(default: int) -> int | None:
    value = os.environ.get("CONN_MAX_AGE", "")
    if not value:
        return default
    return None if value == "none" else int(value)


def _pool_options(size: int) -> dict[str, object]:
    if size <= 0:
        return {}
    return {"pool": {"min_size": min(2, size), "max_size": size, "timeout": 30}}


DATABASES = {"default": _database(os.environ.get("DATABASE_URL"))}

if os.environ.get("REDIS_URL"):
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [os.environ["REDIS_URL"]]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "chatstream:conversation-list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
# The languages a visitor may get: English and those chatstream ships translations for.
LANGUAGES = [("en", "English"), ("de", "Deutsch"), ("fr", "Français"), ("es", "Español")]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"chatstream": {"handlers": ["console"], "level": "INFO"}},
}

# --- chatstream --------------------------------------------------------------------------------
_SIMULATOR = os.environ.get("CHATSTREAM_SIMULATOR_URL", "http://127.0.0.1:8001/v1")
CHATSTREAM_PROVIDERS = {
    "default": {
        "BASE_URL": os.environ.get("CHATSTREAM_BASE_URL", _SIMULATOR),
        "API_KEY": os.environ.get("CHATSTREAM_API_KEY", "sim-demo-key"),
    },
}
CHATSTREAM_MODELS: dict[str, dict[str, object]]
if os.environ.get("CHATSTREAM_MODEL"):
    CHATSTREAM_MODELS = {
        os.environ["CHATSTREAM_MODEL"]: {
            "PROVIDER": "default", "MODEL": os.environ["CHATSTREAM_MODEL"]},
    }
else:
    CHATSTREAM_MODELS = {
        "demo": {"PROVIDER": "default", "MODEL": "default", "LABEL": "Demo (30 tokens/s)"},
        "demo-fast": {"PROVIDER": "default", "MODEL": "default?tps=120", "LABEL": "Demo, fast"},
        "demo-thinking": {"PROVIDER": "default", "MODEL": "thinking",
                          "LABEL": "Demo, thinks first"},
        "demo-tools": {"PROVIDER": "default", "MODEL": "agent", "LABEL": "Demo, calls tools",
                       "TOOLS": ["project.tools.get_weather", "project.tools.get_time"]},
        # Its provider is always overloaded (HTTP 503): every reply comes from its fallback,
        # and says so.
        "demo-overloaded": {"PROVIDER": "default", "MODEL": "http-503?retry_after=5",
                            "LABEL": "Demo, overloaded (falls back)", "FALLBACKS": ["demo"]},
    }

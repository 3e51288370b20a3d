"""System checks for the CHATSTREAM_* settings and for what would break streaming.

Errors (E) stop the site from working; warnings (W) name a setup that works badly. Settings of a
kind with a generic rule (positive seconds, positive integers, flags) are checked by that rule,
for every setting of that kind in conf.py's ``SPEC``; the providers, the models, the quota and
the deployment around the app have checks of their own.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.utils.module_loading import import_string

from .conf import (
    ABORT,
    CALLABLE,
    CALLABLES,
    DETACH,
    DISCONNECT_MODE,
    FLAG,
    OPTIONAL_POSITIVE_INTEGER,
    OPTIONAL_STRINGS,
    POSITIVE_INTEGER,
    POSITIVE_INTEGER_OR_ZERO,
    SECONDS,
    SECONDS_OR_ZERO,
    SPEC,
    STRINGS,
    TEXT,
    Kind,
    conf,
)
from .quota.limits import MONEY_KEYS, setting_errors
from .quota.pricing import PRICE_KEYS, REQUIRED_KEYS, Price
from .tools import resolve


def _positive_seconds(value: object) -> bool:
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and math.isfinite(value) and value > 0)


def _disconnect_mode(value: object) -> bool:
    return value in (ABORT, DETACH)


def _callable(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        return callable(import_string(value))
    except ImportError:
        return False


def _optional_callable(value: object) -> bool:
    return value is None or _callable(value)


def _callables(value: object) -> bool:
    return isinstance(value, list | tuple) and all(_callable(v) for v in value)


def _import_hint(value: object) -> str:
    """Why a dotted path (or the first bad one of a list) names no callable."""
    for path in value if isinstance(value, list | tuple) else [value]:
        if not isinstance(path, str):
            return f"{path!r} is not a dotted path: name a function as 'myapp.chat.hook'."
        try:
            found = import_string(path)
        except ImportError as error:
            return f"{path!r} does not import: {error}"
        if not callable(found):
            return f"{path!r} is a {type(found).__name__}, not a callable."
    return "Name a function as 'myapp.chat.hook'."


# Request fields only the tool loop sets: the model's tools are its TOOLS.
TOOL_FIELDS = ("tools", "tool_choice")


def _check_tools(key: str, entry: dict[str, Any]) -> list[CheckMessage]:
    """A model's TOOLS name @tool functions, with no name twice; its PARAMS set no tools."""
    errors: list[CheckMessage] = []
    params = entry.get("PARAMS", {})
    if fixed := [name for name in TOOL_FIELDS if isinstance(params, dict) and name in params]:
        errors.append(Error(
            f"CHATSTREAM_MODELS[{key!r}]['PARAMS'] sets {fixed!r}: chatstream sends a model's "
            "tools itself, from its TOOLS.",
            hint="List the model's tools as TOOLS: ['myapp.tools.order_status'] (dotted paths "
            "of @tool functions), and remove them from PARAMS.",
            id="chatstream.E031",
        ))
    paths = entry.get("TOOLS", [])
    if not _strings(paths):
        return [*errors, Error(
            f"CHATSTREAM_MODELS[{key!r}]['TOOLS'] must be a list of dotted paths, not "
            f"{paths!r}.",
            hint="Name each @tool function as 'myapp.tools.order_status'.",
            id="chatstream.E030",
        )]
    named: dict[str, str] = {}
    for path in paths:
        try:
            name = resolve(path).name
        except (ImportError, TypeError) as error:
            errors.append(Error(
                f"CHATSTREAM_MODELS[{key!r}]['TOOLS'] lists {path!r}, which names no tool: "
                f"{error}",
                hint="Declare the function with @tool (from chatstream.tools), and give its "
                "full dotted path.",
                id="chatstream.E030",
            ))
            continue
        if name in named:
            errors.append(Error(
                f"CHATSTREAM_MODELS[{key!r}]['TOOLS'] lists two tools named {name!r}: "
                f"{named[name]!r} and {path!r}.",
                hint="The model calls a tool by its function's name: rename one of them.",
                id="chatstream.E030",
            ))
        named[name] = path
    return errors


def _check_fallbacks(key: str, entry: dict[str, Any], models: dict[str, Any]
                     ) -> list[CheckMessage]:
    """A model's FALLBACKS are other models of the allow-list, each once; one with other TOOLS
    would never be used."""
    fallbacks = entry.get("FALLBACKS", [])
    if not _strings(fallbacks):
        return [Error(
            f"CHATSTREAM_MODELS[{key!r}]['FALLBACKS'] must be a list of model keys, not "
            f"{fallbacks!r}.",
            hint="For example FALLBACKS: ['backup'], keys of CHATSTREAM_MODELS tried in order.",
            id="chatstream.E032",
        )]
    messages: list[CheckMessage] = []
    for fallback in fallbacks:
        if fallback == key or fallback not in models or list(fallbacks).count(fallback) > 1:
            why = ("itself" if fallback == key else "a model not in CHATSTREAM_MODELS"
                   if fallback not in models else "a model twice")
            messages.append(Error(
                f"CHATSTREAM_MODELS[{key!r}]['FALLBACKS'] names {fallback!r}: {why}.",
                hint=f"Name other keys of CHATSTREAM_MODELS, each once: {sorted(models)!r}.",
                id="chatstream.E032",
            ))
        elif (isinstance(models[fallback], dict)
              and list(models[fallback].get("TOOLS", [])) != list(entry.get("TOOLS", []))):
            messages.append(Warning(
                f"CHATSTREAM_MODELS[{key!r}]['FALLBACKS'] names {fallback!r}, whose TOOLS "
                "differ: it is never used in its place.",
                hint="A fallback answers with the same tools as the model it stands in for: "
                "give both the same TOOLS, or name another fallback.",
                id="chatstream.W030",
            ))
    return messages


def _check_price(key: str, entry: dict[str, Any]) -> list[CheckMessage]:
    """A model's PRICE, if it has one: decimal strings per million tokens, INPUT and OUTPUT."""
    if "PRICE" not in entry:
        return []
    try:
        Price.parse(entry["PRICE"])
    except ValueError as error:
        return [Error(
            f"CHATSTREAM_MODELS[{key!r}]['PRICE'] is {entry['PRICE']!r}: {error}.",
            hint=f"A dict of decimal strings, 0 or more, per million tokens in "
            f"CHATSTREAM_CURRENCY: {', '.join(REQUIRED_KEYS)} required, "
            f"{', '.join(k for k in PRICE_KEYS if k not in REQUIRED_KEYS)} optional; for "
            'example {"INPUT": "2.50", "OUTPUT": "10.00"} (floats are refused: they are not '
            "exact).",
            id="chatstream.E034",
        )]
    return []


def _check_currency() -> list[CheckMessage]:
    currency = conf.CURRENCY
    if isinstance(currency, str) and re.fullmatch(r"[A-Z]{3}", currency):
        return []
    return [Error(
        f"CHATSTREAM_CURRENCY must be a three-letter code in capitals, not {currency!r}.",
        hint='The ISO 4217 code of the currency of every PRICE, for example "USD" or "EUR".',
        id="chatstream.E035",
    )]


def _positive_integer(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value > 0


def _optional_positive_integer(value: object) -> bool:
    return value is None or _positive_integer(value)


def _integer_or_zero(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 0


def _seconds_or_zero(value: object) -> bool:
    return value == 0 or _positive_seconds(value)


def _flag(value: object) -> bool:
    return isinstance(value, bool)


def _text(value: object) -> bool:
    return isinstance(value, str)


def _strings(value: object) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)


def _optional_strings(value: object) -> bool:
    return value is None or _strings(value)


# The rule a value of each kind must pass, and the id of the error that says it does not. Kinds
# not named here are checked by hand below, or not at all.
KIND_RULES: dict[Kind[Any], tuple[Callable[[object], bool], str]] = {
    SECONDS: (_positive_seconds, "chatstream.E008"),
    POSITIVE_INTEGER: (_positive_integer, "chatstream.E009"),
    POSITIVE_INTEGER_OR_ZERO: (_integer_or_zero, "chatstream.E009"),
    OPTIONAL_POSITIVE_INTEGER: (_optional_positive_integer, "chatstream.E009"),
    FLAG: (_flag, "chatstream.E025"),
    SECONDS_OR_ZERO: (_seconds_or_zero, "chatstream.E012"),
    TEXT: (_text, "chatstream.E013"),
    STRINGS: (_strings, "chatstream.E014"),
    OPTIONAL_STRINGS: (_optional_strings, "chatstream.E014"),
    DISCONNECT_MODE: (_disconnect_mode, "chatstream.E016"),
    CALLABLE: (_optional_callable, "chatstream.E017"),
    CALLABLES: (_callables, "chatstream.E017"),
}

HTMX_MIDDLEWARE = "django_htmx.middleware.HtmxMiddleware"

# Middleware known to read a response's whole body, which buffers (or breaks) a stream.
BUFFERING_MIDDLEWARE = {
    "htmlmin.middleware.HtmlMinifyMiddleware": "it minifies response.content",
    "django_htmlmin.middleware.HtmlMinifyMiddleware": "it minifies response.content",
    "silk.middleware.SilkyMiddleware": "it records whole response bodies",
}


@register(Tags.compatibility)
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
                   ) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    errors += _check_providers()
    errors += _check_models()
    errors += _check_values()
    errors += _check_deployment()
    return errors


def _check_providers() -> list[CheckMessage]:
    providers = conf.PROVIDERS
    if not isinstance(providers, dict) or not providers:
        return [Error(
            f"CHATSTREAM_PROVIDERS must be a non-empty dict, not {providers!r}.",
            hint='Set CHATSTREAM_PROVIDERS = {"default": {"BASE_URL": ..., "API_KEY": ...}}.',
            id="chatstream.E001",
        )]
    errors: list[CheckMessage] = []
    for alias, entry in providers.items():
        url = entry.get("BASE_URL") if isinstance(entry, dict) else None
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            errors.append(Error(
                f"CHATSTREAM_PROVIDERS[{alias!r}]['BASE_URL'] must be an http(s) URL, "
                f"not {url!r}.",
                hint="For example https://api.openai.com/v1 (the part before /chat/completions).",
                id="chatstream.E002",
            ))
        key = entry.get("API_KEY") if isinstance(entry, dict) else None
        if key is not None and not isinstance(key, str):
            errors.append(Error(
                f"CHATSTREAM_PROVIDERS[{alias!r}]['API_KEY'] must be a string.",
                hint="Read it from the environment: os.environ['PROVIDER_API_KEY'].",
                id="chatstream.E003",
            ))
    return errors


def _check_models() -> list[CheckMessage]:
    models = conf.MODELS
    if not isinstance(models, dict) or not models:
        return [Error(
            f"CHATSTREAM_MODELS must be a non-empty dict (the allow-list), not {models!r}.",
            hint='Set CHATSTREAM_MODELS = {"mini": {"PROVIDER": "default", '
            '"MODEL": "gpt-5-mini"}}.',
            id="chatstream.E004",
        )]
    errors: list[CheckMessage] = []
    providers = conf.PROVIDERS if isinstance(conf.PROVIDERS, dict) else {}
    for key, entry in models.items():
        provider = entry.get("PROVIDER", "default") if isinstance(entry, dict) else None
        if provider not in providers:
            errors.append(Error(
                f"CHATSTREAM_MODELS[{key!r}] names provider {provider!r}, which is not in "
                "CHATSTREAM_PROVIDERS.",
                hint=f"Use one of {sorted(providers)!r}.",
                id="chatstream.E005",
            ))
        if len(str(key)) > 100:
            errors.append(Error(f"The model key {key!r} is longer than 100 characters.",
                                hint="Use a short key.", id="chatstream.E006"))
        for field in ("MAX_TOKENS", "CONTEXT_TOKENS"):
            if isinstance(entry, dict) and field in entry and not _positive_integer(entry[field]):
                errors.append(Error(
                    f"CHATSTREAM_MODELS[{key!r}][{field!r}] must be a positive integer, not "
                    f"{entry[field]!r}.",
                    hint=f"Give a whole number of tokens, or leave it out for "
                    f"CHATSTREAM_{field}.",
                    id="chatstream.E015",
                ))
        if isinstance(entry, dict):
            errors += _check_tools(key, entry)
            errors += _check_fallbacks(key, entry, models)
            errors += _check_price(key, entry)
    errors += _check_currency()
    default = conf.DEFAULT_MODEL
    if default is not None and default not in models:
        errors.append(Error(
            f"CHATSTREAM_DEFAULT_MODEL is {default!r}, which is not in CHATSTREAM_MODELS.",
            hint=f"Use one of {sorted(models)!r}, or None for the first.",
            id="chatstream.E007",
        ))
    return errors


def _check_values() -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for name, setting in SPEC.items():
        if setting.kind not in KIND_RULES:
            continue
        valid, check_id = KIND_RULES[setting.kind]
        value = getattr(conf, name)
        if not valid(value):
            errors.append(Error(
                f"CHATSTREAM_{name} must be {setting.kind.must_be}, not {value!r}.",
                hint=(_import_hint(value) if setting.kind in (CALLABLE, CALLABLES) else
                      f"The default is {setting.default!r}."),
                id=check_id,
            ))
    if not errors and conf.STALE_AFTER <= conf.HEARTBEAT_INTERVAL:
        errors.append(Error(
            f"CHATSTREAM_STALE_AFTER ({conf.STALE_AFTER!r}) must be longer than "
            f"CHATSTREAM_HEARTBEAT_INTERVAL ({conf.HEARTBEAT_INTERVAL!r}), or live streams "
            "would be swept.",
            hint="Keep STALE_AFTER several heartbeats long (default 60 and 10).",
            id="chatstream.E010",
        ))
    return errors


def _check_deployment() -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    layer = conf.CHANNEL_LAYER
    layers = getattr(settings, "CHANNEL_LAYERS", {})
    if layer and layers and layer not in layers:
        messages.append(Warning(
            f"CHATSTREAM_CHANNEL_LAYER is {layer!r}, but CHANNEL_LAYERS has no such alias; "
            "Stop falls back to polling the database.",
            hint="Configure channels_redis in CHANNEL_LAYERS, or set CHATSTREAM_CHANNEL_LAYER "
            "= None to poll on purpose.",
            id="chatstream.W001",
        ))
    if HTMX_MIDDLEWARE not in settings.MIDDLEWARE:
        messages.append(Error(
            f"{HTMX_MIDDLEWARE} is not in MIDDLEWARE; chatstream's views read request.htmx.",
            hint=f"Add {HTMX_MIDDLEWARE!r} to MIDDLEWARE, after SessionMiddleware.",
            id="chatstream.E011",
        ))
    for path in settings.MIDDLEWARE:
        if path in BUFFERING_MIDDLEWARE:
            messages.append(Warning(
                f"{path} buffers streaming responses: {BUFFERING_MIDDLEWARE[path]}.",
                hint="Remove it, or make it skip responses whose 'streaming' attribute is True.",
                id="chatstream.W002",
            ))
    if not getattr(settings, "ASGI_APPLICATION", None):
        messages.append(Warning(
            "chatstream streams replies only under ASGI, and ASGI_APPLICATION is not set.",
            hint="Serve the site with an ASGI server (uvicorn project.asgi:application), and "
            "set ASGI_APPLICATION to say so; under WSGI every reply fails with an error.",
            id="chatstream.W003",
        ))
    else:
        messages += _check_streams_in_front(settings.ASGI_APPLICATION)
    return messages


def _check_streams_in_front(path: str) -> list[CheckMessage]:
    """The site's ASGI application should serve streams in front of Django (chatstream.asgi);
    nothing is said when it cannot be imported (the server will say it) or is not found."""
    try:
        app = import_string(path)
    except Exception:
        return []
    for _ in range(8):  # through the usual wrappers: Django's, Sentry's, WhiteNoise's...
        if getattr(app, "serves_streams_in_front", False):
            return []
        app = next((getattr(app, name) for name in ("app", "application", "inner", "__wrapped__")
                    if getattr(app, name, None) is not None), None)
        if app is None:
            break
    return [Warning(
        f"ASGI_APPLICATION ({path}) does not serve chatstream's streams in front of Django: "
        "every stream then goes through all the site's middleware, with their thread hops, "
        "and reaches the provider several milliseconds later.",
        hint="Wrap the application: application = with_fast_streams(get_asgi_application()), "
        "from chatstream.asgi (see docs/deployment.md). Silence chatstream.W004 if the site's "
        "streams need its middleware.",
        id="chatstream.W004",
    )]


# ---------------------------------------------------------------------------------------------
# Per-user quotas (chatstream.quota): CHATSTREAM_DEFAULT_QUOTA, and databases that could not
# serialise their admissions.


@register(Tags.compatibility)
def check_quota(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
                ) -> list[CheckMessage]:
    messages: list[CheckMessage] = list(setting_errors())
    if not messages:
        messages += _check_quota_reachable()
        messages += _check_quota_prices()
    messages += _check_quota_database()
    return messages


def _check_quota_reachable() -> list[CheckMessage]:
    """A token limit below every model's max_tokens refuses every request, forever."""
    value = conf.DEFAULT_QUOTA or {}
    try:
        smallest = min(choice.max_tokens for choice in conf.model_choices())
    except (ValueError, TypeError, AttributeError):
        return []
    # The smallest reservation: a one-token message (plus overheads) and max_tokens.
    floor = smallest + 8
    warnings: list[CheckMessage] = []
    for key in ("TOKENS_PER_DAY", "TOKENS_PER_MONTH"):
        limit = value.get(key)
        if limit is not None and limit < floor:
            warnings.append(Warning(
                f"CHATSTREAM_DEFAULT_QUOTA[{key!r}] is {limit!r}, too small for any request: "
                f"each reserves its prompt plus max_tokens, at least {floor} tokens.",
                hint="Raise the limit, or lower MAX_TOKENS for the models.",
                id="chatstream.W022",
            ))
    return warnings


def _check_quota_prices() -> list[CheckMessage]:
    """A money limit needs a price for every model it may admit, and for their fallbacks."""
    value = conf.DEFAULT_QUOTA or {}
    money = [key for key in MONEY_KEYS if value.get(key) is not None]
    models = conf.MODELS if isinstance(conf.MODELS, dict) else {}
    if not money or not models:
        return []
    admitted = [key for key in value.get("MODELS") or models if key in models]
    reachable = set(admitted)
    for key in admitted:
        fallbacks = models[key].get("FALLBACKS", []) if isinstance(models[key], dict) else []
        reachable.update(k for k in fallbacks if isinstance(k, str) and k in models)
    unpriced = sorted(key for key in reachable
                      if not isinstance(models[key], dict) or "PRICE" not in models[key])
    if not unpriced:
        return []
    return [Error(
        f"CHATSTREAM_DEFAULT_QUOTA sets {money!r}, but the models {unpriced!r} it may admit "
        "(or fall back to) have no PRICE.",
        hint="Give each a PRICE (see docs/costs.md), or leave it out of the quota's MODELS; "
        "a reply with a model that has no price is refused under a money limit.",
        id="chatstream.E036",
    )]


def _check_quota_database() -> list[CheckMessage]:
    from django.db import connections, router

    from .models import QuotaAccount

    alias = router.db_for_write(QuotaAccount)
    if alias not in settings.DATABASES:
        return []
    params = connections[alias].settings_dict
    options = params.get("OPTIONS") or {}
    if params["ENGINE"].endswith("sqlite3"):
        mode = str(options.get("transaction_mode") or "DEFERRED").upper()
        if mode not in ("IMMEDIATE", "EXCLUSIVE"):
            return [Warning(
                f"The SQLite database {alias!r} starts transactions in {mode} mode: concurrent "
                "messages can fail with 'database is locked' instead of queueing for the quota.",
                hint=f"Set DATABASES[{alias!r}]['OPTIONS']['transaction_mode'] = 'IMMEDIATE' "
                "(and a 'timeout' of some seconds).",
                id="chatstream.W020",
            )]
    elif params["ENGINE"].endswith(("postgresql", "postgis")):
        level = options.get("isolation_level")
        if level is not None and not _read_committed(level):
            return [Warning(
                f"The PostgreSQL database {alias!r} uses isolation level {level!r}: concurrent "
                "messages from one user fail with serialization errors (HTTP 500) instead of "
                "waiting for the quota.",
                hint="Use READ COMMITTED (Django's default) for the database chatstream uses.",
                id="chatstream.W021",
            )]
    return []


def _read_committed(level: object) -> bool:
    from django.db.backends.postgresql.psycopg_any import IsolationLevel

    try:  # psycopg 2 and 3 number the levels differently; Django's enum maps either
        # Any settings value may come here: the enum refuses a non-level with ValueError.
        return IsolationLevel(level) in (  # type: ignore[arg-type]
            IsolationLevel.READ_UNCOMMITTED, IsolationLevel.READ_COMMITTED
        )
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------
# Conversation search (chatstream.domain.search_index): its index on each database, once the
# migration that makes it as this version has it has run.

SEARCH_MIGRATION = ("chatstream", "0014_search_code_like_words")


@register(Tags.database)
def check_search_index(app_configs: Sequence[AppConfig] | None = None,
                       databases: Sequence[str] | None = None, **kwargs: Any
                       ) -> list[CheckMessage]:
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections
    from django.db.migrations.recorder import MigrationRecorder

    from .domain import search_index

    messages: list[CheckMessage] = []
    for alias in databases or []:
        connection = connections[alias]
        if (connection.vendor not in ("sqlite", "postgresql")
                or SEARCH_MIGRATION not in MigrationRecorder(connection).applied_migrations()):
            continue
        try:
            lacking = search_index.missing(connection)
        except ImproperlyConfigured:
            continue  # the setting's own check (E013) or the search itself says why
        if connection.vendor == "postgresql" and not search_index.config_exists(connection):
            messages.append(Error(
                f"CHATSTREAM_SEARCH_CONFIG is {conf.SEARCH_CONFIG!r}, which is not a text "
                f"search configuration of the PostgreSQL database {alias!r}: every search "
                "fails.",
                hint="Name one that SELECT cfgname FROM pg_ts_config lists ('simple', the "
                f"default, always is), then run manage.py chatstream_rebuild_search --database "
                f"{alias}.",
                id="chatstream.E038"))
            continue
        if lacking and connection.vendor == "sqlite":
            messages.append(Error(
                f"Conversation search's index on the SQLite database {alias!r} lacks "
                f"{', '.join(lacking)}: its search results fall out of step with the messages "
                "(a migration that rebuilt a table drops its triggers).",
                hint=f"Run manage.py chatstream_rebuild_search --database {alias} (after "
                "every migration that alters chatstream's messages or conversations).",
                id="chatstream.E037"))
        elif lacking:
            messages.append(Warning(
                f"Conversation search's indexes {', '.join(lacking)} on the PostgreSQL database "
                f"{alias!r} are missing, or not made with CHATSTREAM_SEARCH_CONFIG and the "
                "expression searches use: searches read every message of the user.",
                hint=f"Run manage.py chatstream_rebuild_search --database {alias}.",
                id="chatstream.W037"))
    return messages

"""System checks for the CHATSTREAM_* settings and for what would break streaming.

Errors (E) stop the site from working; warnings (W) name a setup that works badly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from .conf import DEFAULTS, conf

POSITIVE_SECONDS = (
    "CONNECT_TIMEOUT", "INACTIVITY_TIMEOUT", "MAX_DURATION", "CHECKPOINT_INTERVAL",
    "HEARTBEAT_INTERVAL", "STALE_AFTER", "PENDING_TIMEOUT", "PING_INTERVAL",
    "STOP_POLL_INTERVAL",
)
POSITIVE_INTEGERS = ("MAX_MESSAGE_LENGTH", "MAX_TOKENS", "MAX_CONNECTIONS", "MAX_EVENT_SIZE")

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
    errors += _check_numbers()
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
            hint='Set CHATSTREAM_MODELS = {"mini": {"PROVIDER": "default", "MODEL": "gpt-5-mini"}}.',
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
    default = conf.DEFAULT_MODEL
    if default is not None and default not in models:
        errors.append(Error(
            f"CHATSTREAM_DEFAULT_MODEL is {default!r}, which is not in CHATSTREAM_MODELS.",
            hint=f"Use one of {sorted(models)!r}, or None for the first.",
            id="chatstream.E007",
        ))
    return errors


def _check_numbers() -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for name in POSITIVE_SECONDS:
        value = getattr(conf, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0
        ):
            errors.append(Error(
                f"CHATSTREAM_{name} must be a positive number of seconds, not {value!r}.",
                hint=f"The default is {DEFAULTS[name]!r}.",
                id="chatstream.E008",
            ))
    for name in POSITIVE_INTEGERS:
        value = getattr(conf, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            errors.append(Error(
                f"CHATSTREAM_{name} must be a positive integer, not {value!r}.",
                hint=f"The default is {DEFAULTS[name]!r}.",
                id="chatstream.E009",
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
    warnings: list[CheckMessage] = []
    layer = conf.CHANNEL_LAYER
    layers = getattr(settings, "CHANNEL_LAYERS", {})
    if layer and layers and layer not in layers:
        warnings.append(Warning(
            f"CHATSTREAM_CHANNEL_LAYER is {layer!r}, but CHANNEL_LAYERS has no such alias; "
            "Stop falls back to polling the database.",
            hint="Configure channels_redis in CHANNEL_LAYERS, or set CHATSTREAM_CHANNEL_LAYER "
            "= None to poll on purpose.",
            id="chatstream.W001",
        ))
    for path in settings.MIDDLEWARE:
        if path in BUFFERING_MIDDLEWARE:
            warnings.append(Warning(
                f"{path} buffers streaming responses: {BUFFERING_MIDDLEWARE[path]}.",
                hint="Remove it, or make it skip responses whose 'streaming' attribute is True.",
                id="chatstream.W002",
            ))
    if not getattr(settings, "ASGI_APPLICATION", None) and "daphne" not in settings.INSTALLED_APPS:
        warnings.append(Warning(
            "chatstream streams replies only under ASGI, and ASGI_APPLICATION is not set.",
            hint="Serve the site with an ASGI server (uvicorn project.asgi:application), and "
            "set ASGI_APPLICATION to say so; under WSGI the stream view answers 501.",
            id="chatstream.W003",
        ))
    return warnings

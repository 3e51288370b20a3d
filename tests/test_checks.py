"""One test per system check id: each bad setting is reported with its value and a hint."""

from __future__ import annotations

import math
from typing import Any

import pytest
from django.core.checks import run_checks

# Django's own model checks ask the database about JSON support.
pytestmark = pytest.mark.django_db

GOOD_PROVIDERS = {"default": {"BASE_URL": "https://api.example.com/v1", "API_KEY": "k"}}
GOOD_MODELS = {"mini": {"PROVIDER": "default", "MODEL": "gpt-mini"}}


def chatstream_messages(**overrides):
    from django.test import override_settings

    with override_settings(**overrides):
        return [m for m in run_checks() if m.id and m.id.startswith("chatstream.")]


def ids(messages):
    return sorted({m.id for m in messages})


def test_good_settings_pass():
    assert chatstream_messages(CHATSTREAM_PROVIDERS=GOOD_PROVIDERS,
                               CHATSTREAM_MODELS=GOOD_MODELS) == []


CASES = [
    pytest.param({"CHATSTREAM_PROVIDERS": {}}, "chatstream.E001", "{}", id="E001-no-providers"),
    pytest.param({"CHATSTREAM_PROVIDERS": {"default": {"BASE_URL": "ftp://x", "API_KEY": "k"}}},
                 "chatstream.E002", "'ftp://x'", id="E002-bad-base-url"),
    pytest.param({"CHATSTREAM_PROVIDERS": {"default": {"BASE_URL": "https://x/v1",
                                                       "API_KEY": 42}}},
                 "chatstream.E003", "API_KEY", id="E003-key-not-a-string"),
    pytest.param({"CHATSTREAM_MODELS": {}}, "chatstream.E004", "allow-list", id="E004-no-models"),
    pytest.param({"CHATSTREAM_MODELS": {"m": {"PROVIDER": "nope"}}}, "chatstream.E005", "'nope'",
                 id="E005-unknown-provider"),
    pytest.param({"CHATSTREAM_MODELS": {"m" * 101: {"PROVIDER": "default"}}}, "chatstream.E006",
                 "longer than 100", id="E006-long-model-key"),
    pytest.param({"CHATSTREAM_DEFAULT_MODEL": "missing"}, "chatstream.E007", "'missing'",
                 id="E007-default-model-not-allowed"),
    pytest.param({"CHATSTREAM_INACTIVITY_TIMEOUT": -1}, "chatstream.E008", "-1",
                 id="E008-negative-seconds"),
    pytest.param({"CHATSTREAM_MAX_DURATION": math.inf}, "chatstream.E008", "inf",
                 id="E008-infinite-seconds"),
    pytest.param({"CHATSTREAM_CHECKPOINT_INTERVAL": "1"}, "chatstream.E008", "'1'",
                 id="E008-seconds-as-string"),
    pytest.param({"CHATSTREAM_MAX_TOKENS": 0}, "chatstream.E009", "0", id="E009-zero-integer"),
    pytest.param({"CHATSTREAM_MAX_CONNECTIONS": 2.5}, "chatstream.E009", "2.5",
                 id="E009-float-integer"),
    pytest.param({"CHATSTREAM_STALE_AFTER": 5, "CHATSTREAM_HEARTBEAT_INTERVAL": 10},
                 "chatstream.E010", "HEARTBEAT", id="E010-stale-shorter-than-heartbeat"),
    pytest.param({"CHATSTREAM_ASYNC_COMMIT": "no"}, "chatstream.E025", "'no'",
                 id="E025-flag-not-a-bool"),
    pytest.param({"CHATSTREAM_SWEEP_INTERVAL": -5}, "chatstream.E012", "-5",
                 id="E012-negative-sweep-interval"),
    pytest.param({"CHATSTREAM_SYSTEM_PROMPT": None}, "chatstream.E013", "None",
                 id="E013-prompt-not-text"),
    pytest.param({"CHATSTREAM_ALLOWED_IMAGE_HOSTS": "example.com"}, "chatstream.E014",
                 "'example.com'", id="E014-hosts-not-a-list"),
    pytest.param({"CHATSTREAM_ON_DISCONNECT": "keep"}, "chatstream.E016", "'keep'",
                 id="E016-unknown-disconnect-mode"),
    pytest.param({"CHATSTREAM_RECONNECT_GRACE": -1}, "chatstream.E012", "-1",
                 id="E012-negative-reconnect-grace"),
    pytest.param({"CHATSTREAM_REQUEST_HOOKS": ["no.such.module"]}, "chatstream.E017",
                 "'no.such.module'", id="E017-hook-that-does-not-import"),
    pytest.param({"CHATSTREAM_REQUEST_HOOKS": ["chatstream.conf.SPEC"]}, "chatstream.E017",
                 "SPEC", id="E017-hook-not-callable"),
    pytest.param({"CHATSTREAM_REQUEST_HOOKS": "tests.hooks_for_tests.sync_hook"},
                 "chatstream.E017", "sync_hook", id="E017-hooks-not-a-list"),
    pytest.param({"CHATSTREAM_ACCESS": "nope"}, "chatstream.E017", "'nope'",
                 id="E017-access-not-a-dotted-path"),
    pytest.param({"CHATSTREAM_API_AUTHENTICATE": "chatstream.nope"}, "chatstream.E017",
                 "chatstream.nope", id="E017-authenticate-missing"),
    pytest.param({"CHATSTREAM_ACCESS": 42}, "chatstream.E017", "42",
                 id="E017-access-not-a-string"),
    pytest.param({"CHATSTREAM_MODELS": {"m": {"PROVIDER": "default", "MAX_TOKENS": 0}}},
                 "chatstream.E015", "'MAX_TOKENS'", id="E015-zero-max-tokens"),
    pytest.param({"CHATSTREAM_MODELS": {"m": {"PROVIDER": "default", "CONTEXT_TOKENS": "8k"}}},
                 "chatstream.E015", "'8k'", id="E015-context-tokens-not-a-number"),
    pytest.param({"CHATSTREAM_MODELS": {"m": {"PROVIDER": "default",
                                              "TOOLS": ["tests.test_tools.nope"]}}},
                 "chatstream.E030", "'tests.test_tools.nope'", id="E030-tool-missing"),
    pytest.param({"CHATSTREAM_MODELS": {"m": {"PROVIDER": "default",
                                              "TOOLS": ["tests.test_tools.unannotated"]}}},
                 "chatstream.E030", "not a function declared with @tool",
                 id="E030-not-a-tool"),
    pytest.param({"CHATSTREAM_MODELS": {"m": {"PROVIDER": "default",
                                              "TOOLS": "tests.test_tools.refund"}}},
                 "chatstream.E030", "list of dotted paths", id="E030-tools-not-a-list"),
    pytest.param({"CHATSTREAM_MODELS": {"m": {"PROVIDER": "default", "TOOLS": [
        "tests.test_tools.refund", "tests.tools_renamed.refund"]}}},
                 "chatstream.E030", "two tools named 'refund'", id="E030-one-name-twice"),
    pytest.param({"CHATSTREAM_MODELS": {"m": {"PROVIDER": "default",
                                              "PARAMS": {"tool_choice": "auto"}}}},
                 "chatstream.E031", "['tool_choice']", id="E031-tools-in-params"),
    pytest.param({"CHATSTREAM_MODELS": {"m": {"PROVIDER": "default",
                                              "PRICE": {"INPUT": 2.5, "OUTPUT": "10"}}}},
                 "chatstream.E034", "2.5", id="E034-float-price"),
    pytest.param({"CHATSTREAM_CURRENCY": "usd"}, "chatstream.E035", "'usd'",
                 id="E035-currency-not-a-code"),
    pytest.param({"CHATSTREAM_MODELS": {
        "m": {"PROVIDER": "default", "PRICE": {"INPUT": "1", "OUTPUT": "2"},
              "FALLBACKS": ["backup"]},
        "backup": {"PROVIDER": "default"}}, "CHATSTREAM_DEFAULT_QUOTA": {
            "COST_PER_MONTH": "20.00", "MODELS": ["m"]}},
                 "chatstream.E036", "['backup']", id="E036-money-quota-unpriced-fallback"),
    pytest.param({"MIDDLEWARE": ["django.contrib.sessions.middleware.SessionMiddleware"]},
                 "chatstream.E011", "HtmxMiddleware", id="E011-no-htmx-middleware"),
    pytest.param({"CHATSTREAM_CHANNEL_LAYER": "missing"}, "chatstream.W001", "'missing'",
                 id="W001-unknown-channel-layer"),
    pytest.param({"MIDDLEWARE": ["htmlmin.middleware.HtmlMinifyMiddleware"]}, "chatstream.W002",
                 "buffers", id="W002-buffering-middleware"),
    pytest.param({"ASGI_APPLICATION": None}, "chatstream.W003", "ASGI", id="W003-not-asgi"),
    pytest.param({"ASGI_APPLICATION": "project.asgi.django_application"}, "chatstream.W004",
                 "in front of Django", id="W004-streams-through-django"),
]


@pytest.mark.parametrize(("overrides", "check_id", "mentions"), CASES)
def test_each_bad_setting_is_reported(overrides, check_id, mentions):
    settings = {"CHATSTREAM_PROVIDERS": GOOD_PROVIDERS, "CHATSTREAM_MODELS": GOOD_MODELS,
                **overrides}
    messages = chatstream_messages(**settings)
    matching = [m for m in messages if m.id == check_id]
    assert matching, ids(messages)
    assert mentions in matching[0].msg
    assert matching[0].hint


def test_demo_project_passes_its_own_checks(settings):
    from django.core.management import call_command

    call_command("check", fail_level="WARNING")


@pytest.mark.parametrize(("value", "says"), [
    (["chatstream.nope"], 'does not define a "nope"'),
    (["no_such_module.hook"], "No module named 'no_such_module'"),
    (["chatstream.conf.SPEC"], "is a dict, not a callable"),
    (["tests.hooks_for_tests.sync_hook", 42], "42 is not a dotted path"),
], ids=["missing-attribute", "missing-module", "not-callable", "not-a-path"])
def test_a_hook_path_that_names_no_callable_is_told_why(value, says):
    messages = chatstream_messages(CHATSTREAM_PROVIDERS=GOOD_PROVIDERS,
                                   CHATSTREAM_MODELS=GOOD_MODELS, CHATSTREAM_REQUEST_HOOKS=value)
    [error] = [m for m in messages if m.id == "chatstream.E017"]
    assert says in error.hint


class AsgiWrapper:
    """An ASGI middleware as error trackers make them: the application it wraps as ``app``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


WRAPPED: Any = None


def test_an_application_serving_streams_in_front_is_found_through_its_wrappers():
    global WRAPPED
    from project.asgi import application, django_application

    for app, warned in ((AsgiWrapper(AsgiWrapper(application)), False),
                        (AsgiWrapper(django_application), True)):
        WRAPPED = app
        messages = chatstream_messages(CHATSTREAM_PROVIDERS=GOOD_PROVIDERS,
                                       CHATSTREAM_MODELS=GOOD_MODELS,
                                       ASGI_APPLICATION="tests.test_checks.WRAPPED")
        assert ("chatstream.W004" in ids(messages)) is warned, ids(messages)

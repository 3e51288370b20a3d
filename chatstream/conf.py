"""chatstream's settings, each declared once, and read live from ``django.conf.settings``.

Every setting is ``CHATSTREAM_<NAME>`` and is declared once, on ``Settings``, as a ``Setting``:
its kind (what its values must be, and their Python type), its default, and the line the
README's settings table shows for it. ``conf.NAME`` returns the site's value or the default,
typed by the kind; nothing is cached, so ``override_settings`` works in tests. ``SPEC`` lists
the declarations: ``checks.py`` derives its per-kind checks from it, and ``tests/test_docs.py``
holds the README's table to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from django.conf import settings

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Kind(Generic[T]):
    """A kind of setting: its values' Python type ``T``, and what a value must be, in words."""

    must_be: str


SECONDS: Kind[float] = Kind("a positive number of seconds")
SECONDS_OR_ZERO: Kind[float] = Kind("a number of seconds, 0 to disable")
POSITIVE_INTEGER: Kind[int] = Kind("a positive integer")
POSITIVE_INTEGER_OR_ZERO: Kind[int] = Kind("a whole number, 0 or more")
OPTIONAL_POSITIVE_INTEGER: Kind[int | None] = Kind("a positive integer or None")
FLAG: Kind[bool] = Kind("True or False")
TEXT: Kind[str] = Kind("a string")
OPTIONAL_TEXT: Kind[str | None] = Kind("a string or None")
DICT: Kind[dict[str, Any]] = Kind("a dict")
OPTIONAL_DICT: Kind[dict[str, Any] | None] = Kind("a dict or None")
STRINGS: Kind[list[str]] = Kind("a list of strings")
OPTIONAL_STRINGS: Kind[list[str] | None] = Kind("a list of strings or None")
DISCONNECT_MODE: Kind[str] = Kind('"abort" or "detach"')
CALLABLE: Kind[str | None] = Kind("a dotted path to a callable, or None")
CALLABLES: Kind[list[str]] = Kind("a list of dotted paths to callables")

ABORT = "abort"
DETACH = "detach"


class Setting(Generic[T]):
    """One setting: its kind, its default, and its row of the README's settings table.

    ``what`` is the row's description; ``default_text`` its default column, which is the
    default written as code unless the declaration says otherwise ("required", "first model").
    As an attribute of ``Settings`` it reads the site's value, or the default.
    """

    def __init__(self, kind: Kind[T], default: T, what: str, *,
                 default_text: str | None = None) -> None:
        self.kind = kind
        self.default = default
        self.what = what
        self.default_text = default_text or _as_code(default)
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type) -> Setting[T]: ...

    @overload
    def __get__(self, instance: Settings, owner: type) -> T: ...

    def __get__(self, instance: Settings | None, owner: type) -> Setting[T] | T:
        if instance is None:
            return self
        value: T = getattr(settings, f"CHATSTREAM_{self.name}", self.default)
        return value


def _as_code(value: object) -> str:
    """``value`` as the README writes a default: ``10`` for 10.0, ``"default"`` for a string."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{json.dumps(value) if isinstance(value, str) else repr(value)}`"


@dataclass(frozen=True)
class ModelChoice:
    """One entry of the allow-list, resolved."""

    key: str
    provider: str
    model: str
    label: str
    max_tokens: int
    context_tokens: int
    params: dict[str, Any]
    tools: tuple[str, ...] = ()
    fallbacks: tuple[str, ...] = ()  # model keys tried in order when a call fails early
    price: dict[str, str] | None = None  # per million tokens: INPUT, CACHED_INPUT, OUTPUT


class Settings:
    """Live, typed view of the ``CHATSTREAM_*`` settings, in the README's order."""

    PROVIDERS = Setting(
        DICT, {},
        '`{alias: {"BASE_URL", "API_KEY", "HEADERS"?, "AUTH_HEADER"?, "NAME"?}}`. The key never '
        "reaches a template, log, error page or the admin. `NAME` is the provider as telemetry "
        "reports it (`openai`, `anthropic`...; the alias without it: see "
        "[docs/observability.md](docs/observability.md)).",
        default_text="required")
    MODELS = Setting(
        DICT, {},
        'The allow-list: `{key: {"PROVIDER", "MODEL", "LABEL"?, "MAX_TOKENS"?, '
        '"CONTEXT_TOKENS"?, "PARAMS"?, "TOOLS"?, "FALLBACKS"?, "PRICE"?}}`. `PARAMS` are extra '
        'request fields (temperature...); `TOOLS` the dotted paths of the `@tool` functions '
        'the model may call (see [docs/tools.md](docs/tools.md)); `FALLBACKS` the model keys '
        'tried in order when a call fails before its first token, and `PRICE` its prices per '
        'million tokens (see [docs/costs.md](docs/costs.md)).',
        default_text="required")
    DEFAULT_MODEL = Setting(
        OPTIONAL_TEXT, None,
        "Key used when the user picks none.",
        default_text="first model")
    SYSTEM_PROMPT = Setting(
        TEXT, "",
        "Sent first in every conversation.")
    MAX_MESSAGE_LENGTH = Setting(
        POSITIVE_INTEGER, 8000,
        "Longest user message, in characters.")
    MAX_TOKENS = Setting(
        POSITIVE_INTEGER, 1024,
        "`max_tokens` sent upstream when the model sets none (always sent).")
    CONTEXT_TOKENS = Setting(
        POSITIVE_INTEGER, 16000,
        "Most tokens (estimated) of conversation sent upstream with a new message, when the "
        "model sets none: the oldest turns are left out first, never the system prompt or the "
        "new message.")
    MAX_CONVERSATION_MESSAGES = Setting(
        POSITIVE_INTEGER, 500,
        "Most messages a user may send in one conversation; then the page asks them to start "
        "a new one.")
    CONVERSATION_PAGE_SIZE = Setting(
        POSITIVE_INTEGER, 50,
        "Exchanges shown on a conversation page; older ones are a link away.")
    MAX_REPLIES_PER_MESSAGE = Setting(
        POSITIVE_INTEGER, 20,
        "Most replies one message may have: its first, then every Retry and Regenerate, "
        "however each ended; one more is refused with a sentence (a 409). A page shows a "
        "message's newest replies, earlier ones a link away.")
    SEARCH_CONFIG = Setting(
        TEXT, "simple",
        "PostgreSQL only: the text search configuration of conversation search (`\"simple\"`: "
        "words as written, lowercased, accents kept; `\"english\"`, `\"german\"`...: stems and "
        "stop words of one language; none cuts Chinese or Japanese text into words). Its "
        "indexes are made with it: run `chatstream_rebuild_search` after a change (see "
        "[docs/search.md](docs/search.md), also for a configuration that leaves accents out).")
    MAX_REPLY_LENGTH = Setting(
        POSITIVE_INTEGER, 200_000,
        "Longest reply, in characters: a longer one is ended there, its text kept "
        "(`interrupted`, `reply_too_long`). The provider's bytes are bounded with it.")
    CONNECT_TIMEOUT = Setting(
        SECONDS, 10.0,
        "Seconds to connect to the provider.")
    INACTIVITY_TIMEOUT = Setting(
        SECONDS, 60.0,
        "Seconds of upstream silence (not a byte) before the reply is `interrupted`.")
    MAX_DURATION = Setting(
        SECONDS, 600.0,
        "Seconds one reply may take in all, from the request to its last byte.")
    CHECKPOINT_INTERVAL = Setting(
        SECONDS, 1.0,
        "Seconds between checkpoints of the partial text.")
    HEARTBEAT_INTERVAL = Setting(
        SECONDS, 10.0,
        "Seconds between liveness writes while the provider is silent.")
    STALE_AFTER = Setting(
        SECONDS, 60.0,
        "Seconds without heartbeat before the sweeper interrupts a stream.")
    PENDING_TIMEOUT = Setting(
        SECONDS, 600.0,
        "Seconds a never-streamed generation waits before it is swept.")
    ON_DISCONNECT = Setting(
        DISCONNECT_MODE, ABORT,
        'What a browser leaving mid-reply does: `"abort"` closes the upstream request at once '
        '(no more tokens billed); `"detach"` lets the reply go on to its end, into the database, '
        "for the page to show on return (see [docs/deployment.md](docs/deployment.md)).")
    RECONNECT_GRACE = Setting(
        SECONDS_OR_ZERO, 0.0,
        'In `"abort"` mode, seconds a reply whose browser left waits for that page to come back '
        "for it (a dropped connection, resumed) before its upstream is closed.")
    HANDOVER_GRACE = Setting(
        SECONDS, 5.0,
        'In `"abort"` mode, seconds a reply whose page closed keeps streaming for a page showing '
        "it (a reload, another tab, the page reconnecting); unwatched that long (or "
        "`RECONNECT_GRACE`, if longer), it is cancelled. A plain tab close cancels at once "
        "(after `RECONNECT_GRACE`).")
    PING_INTERVAL = Setting(
        SECONDS, 5.0,
        "Seconds of silence towards the browser before a `: ping` comment and a `ping` event "
        "(a page that hears nothing for longer reconnects).")
    CHANNEL_LAYER = Setting(
        OPTIONAL_TEXT, "default",
        "Channel layer alias carrying Stop across processes; `None` polls the database.")
    STOP_POLL_INTERVAL = Setting(
        SECONDS, 1.0,
        "Seconds between database polls for Stop when there is no channel layer.")
    STREAM_TICKET_MAX_AGE = Setting(
        SECONDS, 10.0,
        "Seconds a page's stream ticket (`?ticket=` in its stream URL) may start its reply "
        "without a session lookup (see [docs/security.md](docs/security.md)).")
    MAX_FOLLOWERS = Setting(
        POSITIVE_INTEGER, 4,
        "Pages one worker process lets follow one reply at once (reloads, other tabs).")
    MAX_FOLLOWERS_PER_USER = Setting(
        POSITIVE_INTEGER, 8,
        "Replies one user may follow at once in one worker process.")
    MAX_CONNECTIONS = Setting(
        POSITIVE_INTEGER, 1000,
        "Upstream connection pool size per worker process.")
    MAX_KEEPALIVE_CONNECTIONS = Setting(
        POSITIVE_INTEGER, 32,
        "Idle upstream connections kept for reuse per worker process (httpcore rescans its "
        "whole pool for every request, so a large idle pool makes bursts slow).")
    ASYNC_COMMIT = Setting(
        FLAG, True,
        "PostgreSQL only: the claim and the checkpoints are committed without waiting for the "
        "WAL flush (`synchronous_commit = off` on the async pool's connections); the final save "
        "always waits. A crash of the database server itself may lose the last fraction of a "
        "second of them; the sweeper closes such streams as any interrupted one.")
    CLAIM_POOL_SIZE = Setting(
        POSITIVE_INTEGER, 16,
        "PostgreSQL only: connections per worker process of the async pool that claims streams, "
        "writes their checkpoints and saves their outcome on the event loop (on top of Django's "
        "own connections). Claims beyond that many in flight wait and go together, in one "
        "statement.")
    MAX_EVENT_SIZE = Setting(
        POSITIVE_INTEGER, 4 * 1024 * 1024,
        "Largest server-sent event accepted from a provider (characters).")
    ALLOWED_IMAGE_HOSTS = Setting(
        STRINGS, [],
        "Hosts a rendered reply may load images from; others become text.")
    ALLOWED_LINK_HOSTS = Setting(
        OPTIONAL_STRINGS, None,
        "Hosts a rendered reply may link to; links elsewhere become text. `None`: any host.")
    SWEEP_INTERVAL = Setting(
        SECONDS_OR_ZERO, 60.0,
        "Seconds between sweeps the app runs by itself (0: only `chatstream_sweep`).")
    RETENTION_DAYS = Setting(
        OPTIONAL_POSITIVE_INTEGER, None,
        "Days a conversation is kept after its last activity; then `chatstream_sweep` deletes "
        "it, with everything in it (never one with a reply being written or a tool call "
        "waiting; see [docs/export.md](docs/export.md)). `None`: kept for ever.")
    REQUEST_HOOKS = Setting(
        CALLABLES, [],
        "Callables (dotted paths, sync or async) that may change what a new generation sends, "
        "or refuse it; see [docs/integration.md](docs/integration.md).")
    ACCESS = Setting(
        CALLABLE, None,
        "A callable `access(user)` deciding who may chat and with which models: `True` (every "
        "model), `False` (no chat: 403) or the model keys allowed; see "
        "[docs/integration.md](docs/integration.md). `None`: every signed-in user, every model.")
    API_AUTHENTICATE = Setting(
        CALLABLE, None,
        "A callable `authenticate(request)` returning the JSON API's user (a token, say), or "
        "`None` to fall back to the session, with its CSRF check; see "
        "[docs/integration.md](docs/integration.md).")
    MAX_TOOL_CALLS = Setting(
        POSITIVE_INTEGER, 8,
        "Most tool calls one reply may ask for at once; those after them are not run (the "
        "model is told why).")
    MAX_TOOL_STEPS = Setting(
        POSITIVE_INTEGER, 8,
        "Most upstream calls one user message leads to (its reply, then one per round of tool "
        "calls); the last is sent without tools, so the model answers in text.")
    APPROVAL_TIMEOUT = Setting(
        SECONDS, 86_400.0,
        "Seconds a tool call waits for the user's decision; then `chatstream_sweep` ends it "
        "`expired` (the model is told it was declined) and the reply goes on.")
    TOOL_THREADS = Setting(
        POSITIVE_INTEGER, 8,
        "Threads per worker process that run sync tools (their own, apart from the streams'); "
        "calls beyond that many wait for one.")
    MAX_TOOL_RESULT = Setting(
        POSITIVE_INTEGER, 20_000,
        "Longest result of a tool call the model gets, in characters: a longer one is cut, "
        "with a sentence saying so.")
    RETRIES = Setting(
        POSITIVE_INTEGER_OR_ZERO, 1,
        "Times a model is called again after a call that failed before its first token "
        "(connection refused, HTTP 408/409/429/5xx, a timeout before the first byte), before "
        "its `FALLBACKS` are tried; see [docs/costs.md](docs/costs.md).")
    MAX_RETRY_WAIT = Setting(
        SECONDS_OR_ZERO, 10.0,
        "Most seconds one reply waits in all between its calls (a `Retry-After`, a backoff, a "
        "model cooling down); a longer wait is not made: the next fallback is tried, or the "
        "reply fails.")
    BREAKER_FAILURES = Setting(
        POSITIVE_INTEGER, 5,
        "Calls of a model failing in a row (in one process) that cool it down: no process "
        "calls it for `BREAKER_COOLDOWN` seconds (nor while a `Retry-After` it sent runs).")
    BREAKER_COOLDOWN = Setting(
        SECONDS, 30.0,
        "Seconds a model that failed `BREAKER_FAILURES` times in a row gets no calls.")
    CURRENCY = Setting(
        TEXT, "USD",
        "The three-letter code (ISO 4217) of the currency of every `PRICE` and cost.")
    TELEMETRY_CONTENT = Setting(
        FLAG, False,
        "Put the messages and replies in the OpenTelemetry spans (see "
        "[docs/observability.md](docs/observability.md)); off, a span holds no text of "
        "the conversation.")
    DEFAULT_QUOTA = Setting(
        OPTIONAL_DICT, {},
        "Site-wide per-user limits; see [docs/quotas.md](docs/quotas.md).",
        default_text="unlimited")

    def model_choices(self) -> list[ModelChoice]:
        """The allow-listed models, in their settings order."""
        choices = []
        for key, entry in self.MODELS.items():
            choices.append(
                ModelChoice(
                    key=key,
                    provider=entry.get("PROVIDER", "default"),
                    model=entry.get("MODEL", key),
                    label=entry.get("LABEL", key),
                    max_tokens=int(entry.get("MAX_TOKENS", self.MAX_TOKENS)),
                    context_tokens=int(entry.get("CONTEXT_TOKENS", self.CONTEXT_TOKENS)),
                    params=dict(entry.get("PARAMS", {})),
                    tools=tuple(entry.get("TOOLS", ())),
                    fallbacks=tuple(entry.get("FALLBACKS", ())),
                    price=entry.get("PRICE"),
                )
            )
        return choices

    def get_model(self, key: str | None) -> ModelChoice | None:
        """The allow-listed model ``key`` (the default one for None), or None if not allowed."""
        choices = self.model_choices()
        if not choices:
            return None
        if key is None or key == "":
            key = self.DEFAULT_MODEL or choices[0].key
        return next((c for c in choices if c.key == key), None)


SPEC: dict[str, Setting[Any]] = {
    name: value for name, value in vars(Settings).items() if isinstance(value, Setting)
}
"""Every setting's declaration, by name (without ``CHATSTREAM_``), in the README's order."""

conf = Settings()

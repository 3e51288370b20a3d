"""chatstream's settings, read live from ``django.conf.settings`` with documented defaults.

Every setting is ``CHATSTREAM_<NAME>``; ``conf.NAME`` returns the site's value or the default
below. Nothing is cached, so ``override_settings`` works in tests. ``checks.py`` validates
each value; the README has the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # Required: {"alias": {"BASE_URL": ..., "API_KEY": ..., "HEADERS": {...}}}
    "PROVIDERS": {},
    # Required: the allow-list,
    # {"key": {"PROVIDER": alias, "MODEL": name, "LABEL": ..., "PARAMS": {...}}}
    "MODELS": {},
    # Key of CHATSTREAM_MODELS used when the user picks none; None = the first one.
    "DEFAULT_MODEL": None,
    # Prepended to every conversation sent upstream ("" = none).
    "SYSTEM_PROMPT": "",
    # Longest user message accepted, in characters.
    "MAX_MESSAGE_LENGTH": 8000,
    # max_tokens sent upstream when the model entry sets none (the server always sets one).
    "MAX_TOKENS": 1024,
    # Seconds to open a connection to the provider.
    "CONNECT_TIMEOUT": 10.0,
    # Seconds of upstream silence (no byte at all) before the reply is interrupted.
    "INACTIVITY_TIMEOUT": 60.0,
    # Seconds one reply may take from the request to its last byte.
    "MAX_DURATION": 600.0,
    # Seconds between checkpoints of the partial text to the database.
    "CHECKPOINT_INTERVAL": 1.0,
    # Seconds between liveness writes while the provider is silent.
    "HEARTBEAT_INTERVAL": 10.0,
    # Seconds without a heartbeat after which the sweeper marks a stream interrupted.
    "STALE_AFTER": 60.0,
    # Seconds a generation may stay pending (nobody opened its stream) before it is swept.
    "PENDING_TIMEOUT": 600.0,
    # Seconds a stream whose browser left keeps going for a reloaded page (or another tab)
    # that shows it; once no page has watched it that long, it is cancelled.
    "HANDOVER_GRACE": 5.0,
    # Seconds a stream ticket (the signed ?ticket= of a page's stream URL) stays valid; a
    # request with an expired ticket is authenticated by its session instead.
    "STREAM_TICKET_MAX_AGE": 60.0,
    # Seconds of silence towards the browser before a ": ping" comment is sent.
    "PING_INTERVAL": 15.0,
    # Alias in CHANNEL_LAYERS that carries Stop across processes; None = poll the database.
    "CHANNEL_LAYER": "default",
    # Seconds between database polls for a Stop when no channel layer is configured.
    "STOP_POLL_INTERVAL": 1.0,
    # Connections of the async PostgreSQL pool that claims streams, writes their checkpoints
    # and saves their outcome on the event loop (per worker process; see pgasync.py).
    "CLAIM_POOL_SIZE": 16,
    # PostgreSQL only: commit the claim and the checkpoints without waiting for the WAL flush
    # (synchronous_commit off on that pool's connections; the final save still waits). If the
    # database server itself crashes, the last fraction of a second of them may be lost.
    "ASYNC_COMMIT": True,
    # Idle upstream connections kept open for reuse (per worker process). httpcore scans its
    # whole pool for every request it adds or removes, so a large idle pool turns a burst of
    # new streams into seconds of CPU; new connections beyond it are opened as needed.
    "MAX_KEEPALIVE_CONNECTIONS": 32,
    # Size of the shared upstream connection pool (per worker process).
    "MAX_CONNECTIONS": 1000,
    # Largest single server-sent event accepted from a provider, in characters.
    "MAX_EVENT_SIZE": 4 * 1024 * 1024,
    # Hosts whose images a rendered reply may load; remote images are links otherwise.
    "ALLOWED_IMAGE_HOSTS": [],
    # Seconds between lazy sweeps run by the app itself (0 disables them).
    "SWEEP_INTERVAL": 60.0,
    # Site-wide default per-user limits; see chatstream.quota. None for a limit = unlimited.
    "DEFAULT_QUOTA": {},
}


@dataclass(frozen=True)
class ModelChoice:
    """One entry of the allow-list, resolved."""

    key: str
    provider: str
    model: str
    label: str
    max_tokens: int
    params: dict[str, Any]


class Settings:
    """Live view of the ``CHATSTREAM_*`` settings."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"chatstream has no setting {name!r}")
        return getattr(settings, f"CHATSTREAM_{name}", DEFAULTS[name])

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
                    params=dict(entry.get("PARAMS", {})),
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


conf = Settings()

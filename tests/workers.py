"""Worker processes for multi-process tests: ``uvicorn --workers N`` on a shared database.

The tests' settings (``tests.settings``) are passed to the workers with overrides as JSON, and
sessions live in signed cookies, so a login made in the test process works in every worker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.db import connections

ROOT = Path(__file__).resolve().parent.parent


def database_env(alias: str = "default") -> dict[str, str]:
    """Environment that points a worker at the test database behind ``alias``."""
    params = connections[alias].settings_dict
    if params["ENGINE"].endswith("sqlite3"):
        return {"SQLITE_PATH": str(params["NAME"])}
    user = params.get("USER") or ""
    host = params.get("HOST") or "127.0.0.1"
    port = params.get("PORT") or "5432"
    return {"DATABASE_URL": f"postgres://{user}@{host}:{port}/{params['NAME']}"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Workers:
    """``uvicorn project.asgi:application --workers N`` in a subprocess."""

    def __init__(self, *, workers: int = 2, alias: str = "default",
                 overrides: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                 server: str = "uvicorn") -> None:
        self.port = free_port()
        chatstream = {name: getattr(settings, name) for name in dir(settings)
                      if name.startswith("CHATSTREAM_")}
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DJANGO_DEBUG": "0",
            "CHATSTREAM_TEST_OVERRIDES": json.dumps({**chatstream, **(overrides or {})}),
            **database_env(alias),
            **(env or {}),
        }
        self.env.pop("CHATSTREAM_TEST_POSTGRES", None)
        if server == "daphne":
            self.command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p",
                            str(self.port), "project.asgi:application"]
        else:
            self.command = [sys.executable, "-m", "uvicorn", "project.asgi:application",
                            "--host", "127.0.0.1", "--port", str(self.port), "--workers",
                            str(workers), "--no-access-log", "--log-level", "warning"]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Workers:
        self.process = subprocess.Popen(self.command, cwd=ROOT, env=self.env,
                                        start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(self.url + "/accounts/login/", timeout=1)
                return self
            except httpx.HTTPError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"workers did not start: {self.command}") from None
                time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(5)
        self.process = None


# What a test that may use PostgreSQL declares: ``django_db(databases=DATABASES)``.
DATABASES = ["default", "postgres"] if "postgres" in settings.DATABASES else ["default"]


def postgres_available() -> bool:
    return "postgres" in settings.DATABASES


def redis_available(
    url: str = os.environ.get("CHATSTREAM_TEST_REDIS", "redis://127.0.0.1:6379/0"),
) -> bool:
    try:
        import redis
    except ImportError:
        return False
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except Exception:
        return False

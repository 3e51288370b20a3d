"""Server processes for multi-process tests: the app under each ASGI server a site deploys with.

Each server is one command line (``SERVERS``), run in a process group of its own on a free port
and on the tests' database. The tests' settings (``tests.settings``) are passed to it with
overrides as JSON, and sessions live in signed cookies, so a login made in the test process works
in every server process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gunicorn
import httpx
from django.conf import settings
from django.db import connections

ROOT = Path(__file__).resolve().parent.parent

# Each server's command line, after the interpreter: {port} is a free port, {workers} a number of
# processes (for the servers that take one) and {loop} the suite's event loop
# (CHATSTREAM_TEST_LOOP); a server that names its loop runs on it whatever the suite's is.
SERVERS = {
    "uvicorn": "-m uvicorn project.asgi:application --host 127.0.0.1 --port {port} "
               "--workers {workers} --loop {loop} --no-access-log --log-level warning",
    "uvicorn-uvloop-httptools": "-m uvicorn project.asgi:application --host 127.0.0.1 "
                                "--port {port} --loop uvloop --http httptools --no-access-log",
    "uvicorn-asyncio-h11": "-m uvicorn project.asgi:application --host 127.0.0.1 --port {port} "
                           "--loop asyncio --http h11 --no-access-log",
    # The site's Django application alone, without chatstream's stream front (chatstream.asgi).
    "uvicorn-uvloop-django": "-m uvicorn project.asgi:django_application --host 127.0.0.1 "
                             "--port {port} --loop uvloop --http httptools --no-access-log",
    "daphne": "-m daphne -b 127.0.0.1 -p {port} project.asgi:application",
    # uvicorn's worker for gunicorn: uvloop and httptools when installed, as they are here. No
    # control socket (gunicorn 25.1+): there is one per user's home, which every gunicorn running
    # would share.
    "gunicorn-uvicorn-worker": "-m gunicorn project.asgi:application -b 127.0.0.1:{port} "
                               "-w {workers} -k uvicorn_worker.UvicornWorker"
                               + (" --no-control-socket" if gunicorn.version_info >= (25, 1)
                                  else ""),
    "hypercorn-asyncio": "-m hypercorn project.asgi:application -b 127.0.0.1:{port} -k asyncio",
    "hypercorn-uvloop": "-m hypercorn project.asgi:application -b 127.0.0.1:{port} -k uvloop",
    # daphne's runserver (daphne comes first in INSTALLED_APPS), serving ASGI_APPLICATION.
    "runserver-daphne": "manage.py runserver 127.0.0.1:{port} --noreload",
}


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
    """The app under one of ``SERVERS`` (by default ``uvicorn --workers N``), in a subprocess.

    What the server prints goes to a file (``output()``): a server that does not start fails
    with it, and a test that fails while the server runs shows it on stderr.
    """

    def __init__(self, *, workers: int = 2, alias: str = "default",
                 overrides: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                 server: str = "uvicorn") -> None:
        self.server = server
        self.alias = alias
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
        loop = os.environ.get("CHATSTREAM_TEST_LOOP", "asyncio")
        self.command = [sys.executable,
                        *SERVERS[server].format(port=self.port, workers=workers, loop=loop).split()]
        self.process: subprocess.Popen[bytes] | None = None
        self.log: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        """What the server has printed so far, stdout and stderr."""
        return Path(self.log.name).read_text(errors="replace") if self.log else ""

    def __enter__(self) -> Workers:
        self.log = tempfile.NamedTemporaryFile(prefix=f"chatstream-{self.server}-", suffix=".log")
        self.process = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(self.url + "/accounts/login/", timeout=1)
                return self
            except httpx.HTTPError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    output = self.output()
                    self.__exit__()
                    raise RuntimeError(
                        f"{self.server} did not start: {' '.join(self.command)}\n{output}"
                    ) from None
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self.process is None:
            return
        self.stop()
        if exc and exc[0] is not None:
            print(f"--- {self.server} printed ---\n{self.output()}", file=sys.stderr)
        self.log.close()
        self.log = None

    def stop(self) -> None:
        """Stop the server and whatever it started (its process group): SIGTERM, then SIGKILL
        for what is left of the group once the server has exited or 15 s have passed."""
        assert self.process is not None
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
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


class ToPostgres:
    """A database router: every model read and written on the ``postgres`` alias (a test sets
    ``DATABASE_ROUTERS = [ROUTE_TO_POSTGRES]``)."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return "postgres"

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "postgres"

    def allow_relation(self, *objects: Any, **hints: Any) -> bool:
        return True


ROUTE_TO_POSTGRES = f"{__name__}.ToPostgres"


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

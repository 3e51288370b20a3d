"""The :class:`Simulator`: an OpenAI-compatible Chat Completions server on its own thread and loop.

Sync tests, async tests (on any loop) and other processes all reach it over real HTTP. Every
``/v1/chat/completions`` request is recorded, including the moment its client went away, so a test
can prove an upstream stream was really aborted. docs/simulator.md is the reference.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType, TracebackType

from .protocol import Connection, Request
from .recording import RecordedRequest, RequestLog
from .responses import answer, authorized, send_json, unauthorized
from .scripts import SCENARIOS, Script
from .stream import error_body

logger = logging.getLogger("chatstream.testing")

BACKLOG = 4096


class Simulator:
    """A simulated OpenAI-compatible upstream; ``with Simulator() as sim:`` starts and stops it."""

    def __init__(
        self, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None
    ) -> None:
        self.host = host
        self.port = port
        self._api_key = api_key
        self._scenarios: dict[str, Script] = dict(SCENARIOS)
        self._log = RequestLog()
        self._connections: set[Connection] = set()
        self._numbers = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    def __repr__(self) -> str:
        key = "***" if self._api_key else None
        state = "running" if self.running else "stopped"
        return f"<Simulator {self.url} api_key={key} {state}>"

    # Lifecycle

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def url(self) -> str:
        """The server's root URL, e.g. ``http://127.0.0.1:8001``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI ``base_url``, e.g. ``http://127.0.0.1:8001/v1``."""
        return self.url + "/v1"

    def start(self) -> Simulator:
        """Start serving on a thread; return once the port is listening."""
        if self._thread is not None:
            return self
        ready = threading.Event()
        failures: list[BaseException] = []
        thread = threading.Thread(
            target=self._run, args=(ready, failures), name="chatstream-simulator", daemon=True
        )
        thread.start()
        ready.wait()
        if failures:
            thread.join()
            raise failures[0]
        self._thread = thread
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener and every open connection, then join the thread."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None or loop is None or stop is None:
            return
        if thread.is_alive():
            loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError(f"The simulator at {self.url} did not stop within {timeout}s.")
        self._thread = self._loop = self._stop = None

    def serve_forever(self, announce: Callable[[str], None] = print) -> None:
        """Start, announce the base URL, and serve until Ctrl-C or SIGTERM (for the CLI)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _interrupt)
        self.start()
        announce(f"chatstream simulator listening on {self.base_url} (Ctrl-C to stop)")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # Scenarios and records

    @property
    def scenarios(self) -> Mapping[str, Script]:
        """Built-in and registered scenarios by name (read-only)."""
        return MappingProxyType(self._scenarios)

    def register(self, name: str, script: Script) -> None:
        """Make ``model="name"`` (or ``"name?key=value"``) select ``script``."""
        if not name or "?" in name:
            raise ValueError(f"A scenario name must be non-empty and without '?', not {name!r}.")
        if not isinstance(script, Script):
            raise TypeError(f"register() needs a Script, not {type(script).__name__}.")
        self._scenarios = {**self._scenarios, name: script}  # copy: the server thread reads it

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every Chat Completions request so far, oldest first (a snapshot of live records)."""
        return self._log.snapshot()

    @property
    def last_request(self) -> RecordedRequest | None:
        records = self._log.snapshot()
        return records[-1] if records else None

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block until at least ``count`` requests arrived; TimeoutError otherwise."""
        return self._log.wait_for(count, timeout)

    async def await_for_requests(
        self,
        count: int,
        timeout: float = 5.0,  # noqa: ASYNC109 - the twin of wait_for_requests
    ) -> list[RecordedRequest]:
        """Async twin of :meth:`wait_for_requests` that keeps the calling event loop running."""
        return await self._log.await_for(count, timeout)

    def reset(self, *, scenarios: bool = True) -> None:
        """Forget recorded requests and, unless ``scenarios=False``, registered scenarios."""
        self._log.clear()
        if scenarios:
            self._scenarios = dict(SCENARIOS)

    # The server thread

    def _run(self, ready: threading.Event, failures: list[BaseException]) -> None:
        try:
            asyncio.run(self._main(ready))
        except BaseException as exc:  # handed to start(), or logged once serving
            if ready.is_set():
                logger.exception("The simulator's event loop failed")
            else:
                failures.append(exc)
                ready.set()

    async def _main(self, ready: threading.Event) -> None:
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await loop.create_server(
            lambda: Connection(self._handle, self._connections, next(self._numbers)),
            self.host,
            self.port,
            backlog=BACKLOG,
        )
        self.port = server.sockets[0].getsockname()[1]
        self._loop = loop
        ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            tasks = [conn.task for conn in self._connections if conn.task is not None]
            for conn in list(self._connections):
                conn.abort()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.wait_closed()

    async def _handle(self, conn: Connection, request: Request) -> None:
        route = (request.method, request.path)
        if route == ("POST", "/v1/chat/completions"):
            await answer(
                conn, request, scenarios=self._scenarios, api_key=self._api_key, log=self._log
            )
        elif route == ("GET", "/v1/models"):
            if not authorized(request.headers, self._api_key):
                send_json(conn, 401, unauthorized(request.headers))
                return
            created = int(time.time())
            models = [
                {
                    "id": name,
                    "object": "model",
                    "created": created,
                    "owned_by": "chatstream-simulator",
                }
                for name in self._scenarios
            ]
            send_json(conn, 200, {"object": "list", "data": models})
        elif route == ("GET", "/_simulator/requests"):
            send_json(
                conn, 200, {"requests": [record.to_dict() for record in self._log.snapshot()]}
            )
        elif route == ("POST", "/_simulator/reset"):
            self.reset()
            send_json(conn, 200, {"reset": True})
        else:
            error = error_body(404, message=f"Invalid URL ({request.method} {request.path})")
            error["error"]["code"] = None
            send_json(conn, 404, error)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt

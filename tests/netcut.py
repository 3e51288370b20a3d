"""A TCP proxy whose network can be cut: what a browser meets when its connection drops.

Playwright's offline mode only refuses new requests: a response already streaming goes on. A
real cut resets the connections that are open and refuses new ones until the network is back;
or, worse, it leaves the browser's side of an open connection silent, never told (a phone
changing networks, a NAT that forgot the connection): the browser waits on it for ever. Put
this proxy between the browser and the site and call :meth:`CutProxy.cut` and
:meth:`CutProxy.restore`.
"""

from __future__ import annotations

import socket
import struct
import threading
from contextlib import suppress

_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, as a dropped link does


class _Pair:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.cut = False
        self.spoke_while_cut = False  # the browser sent something the cut network lost
        self.open_directions = 2


class CutProxy:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``target``, one thread per direction."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self.connections = 0  # accepted since the start
        self._pairs: set[_Pair] = set()
        self._silenced: list[_Pair] = []  # kept open, never read or written again
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> CutProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def cut(self, *, silent: bool = False) -> None:
        """The network goes down: new connections are refused, the site's side of every open
        one is reset, and so is the browser's, unless ``silent``: then the browser is never
        told, and its side stays open and mute (for ever, as after a real silent drop)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, set()
            for pair in pairs:
                pair.cut = True
            if silent:
                self._silenced += pairs
        for pair in pairs:
            _reset(pair.upstream)
            if not silent:
                _reset(pair.client)

    def restore(self) -> None:
        """The network is back: connections are accepted again, on the same port. A silenced
        connection the browser sent something on meanwhile is reset now, as the site's side
        answers a packet of a connection it no longer has; one the browser never speaks on
        (a stream it only reads) stays mute."""
        if self._listener is None:
            self.start()
        with self._lock:
            spoke = [pair for pair in self._silenced if pair.spoke_while_cut]
            self._silenced = [pair for pair in self._silenced if not pair.spoke_while_cut]
        for pair in spoke:
            _reset(pair.client)

    def close(self) -> None:
        self.cut()
        with self._lock:
            silenced, self._silenced = self._silenced, []
        for pair in silenced:
            _reset(pair.client)

    def __enter__(self) -> CutProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _address = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                _reset(client)
                continue
            pair = _Pair(client, upstream)
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    _reset(client)
                    _reset(upstream)
                    return
                self._pairs.add(pair)
                self.connections += 1
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(pair, source, sink),
                                 daemon=True).start()

    def _pump(self, pair: _Pair, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if not pair.cut:
                    sink.sendall(data)
                elif self._listener is None:
                    pair.spoke_while_cut = True  # lost with the network
                else:  # the network is back, the connection is not: reset
                    _reset(pair.client)
                    break
            if not pair.cut:
                sink.shutdown(socket.SHUT_WR)  # a clean end is passed on as one
        except OSError:
            if not pair.cut:  # one side failed: the other learns it the same way
                _reset(pair.client)
                _reset(pair.upstream)
        with self._lock:
            pair.open_directions -= 1
            finished = pair.open_directions == 0 and not pair.cut
            if finished:
                self._pairs.discard(pair)
        if finished:
            pair.client.close()
            pair.upstream.close()


def _reset(sock: socket.socket) -> None:
    """Abort ``sock``: its peer gets an RST. The socket is shut first: a thread blocked reading
    it would otherwise keep it open (Linux closes a socket once no call uses it)."""
    with suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with suppress(OSError):
        sock.close()

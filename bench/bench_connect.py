"""What one new upstream connection costs: chatstream's network layer against asyncio's own
``create_connection`` with Happy Eyeballs (what the layer called before uvloop showed that not
every loop takes ``happy_eyeballs_delay``). Rounds alternate, so the machine's drift hits both.

    .venv/bin/python bench/bench_connect.py [--loop uvloop]

Not a test; prints microseconds per loopback connect (connect and close), per round.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chatstream import network

ROUNDS, CONNECTS = 6, 500


async def chatstream_layer(port: int) -> None:
    stream = await network.Backend().connect_tcp("127.0.0.1", port, timeout=5)
    await stream.aclose()


async def asyncio_happy_eyeballs(port: int) -> None:
    loop = asyncio.get_running_loop()
    transport, _protocol = await loop.create_connection(
        network._Protocol, "127.0.0.1", port, happy_eyeballs_delay=0.25)
    transport.close()


async def main(paths: dict[str, Callable[[int], Awaitable[None]]]) -> None:
    server = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    times: dict[str, list[float]] = {name: [] for name in paths}
    for round_ in range(ROUNDS):
        for name in sorted(paths, reverse=bool(round_ % 2)):
            started = time.perf_counter()
            for _ in range(CONNECTS):
                await paths[name](port)
            times[name].append((time.perf_counter() - started) / CONNECTS * 1e6)
    server.close()
    for name, per_round in times.items():
        print(f"{name:24} µs per connect: median {statistics.median(per_round):.0f}, rounds "
              + " ".join(f"{t:.0f}" for t in per_round))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args()
    paths: dict[str, Callable[[int], Awaitable[None]]] = {"chatstream network layer":
                                                          chatstream_layer}
    if args.loop == "asyncio":  # uvloop's create_connection has no happy_eyeballs_delay
        paths["asyncio happy eyeballs"] = asyncio_happy_eyeballs
        asyncio.run(main(paths))
    else:
        import uvloop

        uvloop.run(main(paths))

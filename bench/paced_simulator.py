"""The simulated upstream with one scenario whose pace the benchmark sets between phases.

Run: ``python bench/paced_simulator.py --port 8001``   (bench_start.py starts it for you)

A chatstream server is configured with one model (``CHATSTREAM_MODEL``), and the model's name
is the simulator's script, so the pace of its replies could not change without restarting every
server. This simulator adds the scenario ``bench``: the default script echoing the user's
message with no first-token delay, at the pace last set by ``POST /_bench/pace?tps=N``
(``tps=0``: every chunk at once, the fast upstream; ``tps=20``: 20 deltas a second). Everything
else is ``python -m chatstream.testing``'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from urllib.parse import parse_qs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chatstream.testing.protocol import Connection, Request
from chatstream.testing.responses import send_json
from chatstream.testing.scripts import Script
from chatstream.testing.server import Simulator

SCENARIO = "bench"
ECHO = Script(echo=True, first_token_delay=0.0)


class PacedSimulator(Simulator):
    def pace(self, tps: float) -> None:
        self.register(SCENARIO, dataclasses.replace(ECHO, tokens_per_second=tps))

    def reset(self, *, scenarios: bool = True) -> None:
        super().reset(scenarios=False)  # /_simulator/reset forgets the records, not the pace

    async def _handle(self, conn: Connection, request: Request) -> None:
        if (request.method, request.path) == ("POST", "/_bench/pace"):
            tps = float(parse_qs(request.query).get("tps", ["0"])[0])
            self.pace(tps)
            send_json(conn, 200, {"scenario": SCENARIO, "tps": tps})
            return
        await super()._handle(conn, request)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--tps", type=float, default=0.0, help="the starting pace")
    options = parser.parse_args()
    simulator = PacedSimulator(host="127.0.0.1", port=options.port)
    simulator.pace(options.tps)
    simulator.serve_forever(announce=lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()

"""``python -m chatstream.testing --port 8001``: run the simulator in the foreground."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .server import Simulator


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m chatstream.testing",
        description="Serve the simulated OpenAI-compatible upstream until Ctrl-C.",
    )
    add_arguments(parser)
    options = parser.parse_args(argv)
    simulator = Simulator(host=options.host, port=options.port, api_key=options.api_key)
    simulator.serve_forever(announce=lambda line: print(line, flush=True))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options shared with ``manage.py chatstream_simulator``."""
    parser.add_argument(
        "--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, default=8001, help="port; 0 picks a free one (default 8001)"
    )
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")


if __name__ == "__main__":
    main(sys.argv[1:])

"""pytest fixtures for the simulator.

Enable them in the root conftest.py: ``pytest_plugins = ["chatstream.testing.pytest_plugin"]``.

- ``chatstream_simulator`` (session): one :class:`Simulator` on a free port, started once.
- ``simulator`` (function): the same server, its request log and registered scenarios reset
  before the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .server import Simulator


@pytest.fixture(scope="session")
def chatstream_simulator() -> Iterator[Simulator]:
    """The session's simulator, listening on a free port of 127.0.0.1."""
    with Simulator() as simulator:
        yield simulator


@pytest.fixture
def simulator(chatstream_simulator: Simulator) -> Simulator:
    """The session's simulator with an empty request log and only the built-in scenarios."""
    chatstream_simulator.reset()
    return chatstream_simulator

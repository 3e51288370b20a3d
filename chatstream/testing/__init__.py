"""A simulated OpenAI-compatible upstream for tests, demos and benchmarks.

    from chatstream.testing import Simulator, Script

    with Simulator() as sim:                    # a free port on 127.0.0.1, its own thread
        sim.register("xss", Script(text="<script>alert(1)</script>", tokens_per_second=0))
        ...                                     # point the provider's BASE_URL at sim.base_url
        assert sim.last_request.client_closed

The model name picks the reply: ``"drop"``, ``"stall"``, ``"fast?text=Hi&tps=50"``...
docs/simulator.md is the reference. No Django import here: host sites' plain pytest runs use it.
"""

from __future__ import annotations

from .recording import RecordedRequest
from .scripts import DEFAULT_TEXT, SCENARIOS, ScenarioError, Script, tokenize
from .server import Simulator

__all__ = [
    "DEFAULT_TEXT",
    "SCENARIOS",
    "RecordedRequest",
    "ScenarioError",
    "Script",
    "Simulator",
    "tokenize",
]

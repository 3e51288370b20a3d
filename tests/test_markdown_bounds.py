"""render_markdown costs time linear in the text on CommonMark's known pathological inputs.

markdown-it-py is linear on all of them (bench/README.md, "Markdown"); this keeps it so. Speed
is never asserted: the CPU time of 50,000 characters against a quarter of that
(tests/cpu_time.py).
"""

from __future__ import annotations

import pytest

from chatstream.web.rendering import render_markdown

from .cpu_time import LINEAR, growth
from .pathological_markdown import PATHOLOGICAL

SIZE = 50_000


@pytest.mark.parametrize("name", PATHOLOGICAL)
def test_pathological_markdown_renders_in_time_linear_in_its_length(name):
    assert growth(render_markdown, PATHOLOGICAL[name], SIZE) < LINEAR

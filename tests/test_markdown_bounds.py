"""render_markdown costs time linear in the text on CommonMark's known pathological inputs.

markdown-it-py is linear on all of them (bench/README.md, "Markdown"); this keeps it so. As in
test_highlight_bounds.py, speed is never asserted: the process CPU time of 50,000 characters
against a quarter of that, the least of a few runs, with a wide margin.
"""

from __future__ import annotations

import time

import pytest

from chatstream.rendering import render_markdown

from .pathological_markdown import PATHOLOGICAL

SIZE = 50_000
LINEAR = 8  # the most CPU time 4x the characters may cost: 4 when linear, 16 when quadratic
REPEATS = 3


def _cpu(text: str) -> float:
    start = time.process_time()
    render_markdown(text)
    return time.process_time() - start


@pytest.mark.parametrize("name", PATHOLOGICAL)
def test_pathological_markdown_renders_in_time_linear_in_its_length(name):
    small, large = PATHOLOGICAL[name](SIZE // 4), PATHOLOGICAL[name](SIZE)
    quarter = full = float("inf")
    for _ in range(REPEATS):
        quarter, full = min(quarter, _cpu(small)), min(full, _cpu(large))
        if full < LINEAR * quarter:
            break
    assert full / quarter < LINEAR

"""What Markdown as it streams costs the server: CPU per delta of the page's events.

Run: .venv/bin/python bench/bench_blocks.py [--repeats N]   (not a test)

Three ways to write one reply's events to the page, each fed the same deltas (the simulated
upstream's ~4-character token pieces, one per delta, as a reply at a provider's pace arrives):

- **escaped**: the ``delta`` events alone (what the page had before: text, rendered only by
  the final message);
- **blocks**: ``PageWire`` as it is: the same ``delta`` events, and a ``block`` event for each
  Markdown block once it is finished (markdown_blocks.py), the rest flushed at the end;
- **naive**: the ``delta`` event and the whole reply so far rendered again after every delta
  (what a page that shows Markdown as it streams without a tracker would cost); the
  renderings are timed at 60 deltas spread evenly over the reply, and scaled to all of them.

The final message (``done``), rendered once in every case, is left out; its cost is shown for
scale. Texts: the simulator's default reply, and a long code-heavy one (prose and ~800 lines
of Python in a few fences). Each figure is the median of the repeats, in process CPU time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("DJANGO_DEBUG", "1")  # the demo's settings, as `make demo` runs them

import django

django.setup()

from chatstream.rendering import render_markdown  # noqa: E402
from chatstream.stream._wire import PageWire, Sent, delta  # noqa: E402
from chatstream.testing import DEFAULT_TEXT  # noqa: E402
from chatstream.testing.scripts import tokenize  # noqa: E402

SAMPLES = 60


def code_heavy() -> str:
    """A long reply mostly made of code: four fences of ~200 lines, prose and a list between."""
    parts = ["Here is the whole module, in four parts.\n\n"]
    for part in range(4):
        parts.append(f"## Part {part + 1}\n\nThis part handles **step {part + 1}**:\n\n"
                     "- it reads the input\n- it checks it\n- it writes the output\n\n"
                     "```python\n")
        for n in range(50):
            parts.append(f"def handler_{part}_{n}(request, *, limit={n}):\n"
                         f"    items = [x for x in request.items if x.size < limit]  # {n}\n"
                         "    return {\"count\": len(items), \"ok\": True}\n\n")
        parts.append("```\n\n")
    parts.append("That is all: run it with `python module.py`.")
    return "".join(parts)


def escaped(pieces: list[str]) -> None:
    sent = Sent()
    for piece in pieces:
        delta(sent.piece(piece), sent)


def blocks(pieces: list[str]) -> None:
    wire, sent = PageWire(str), Sent()
    for piece in pieces:
        wire.delta(sent.piece(piece), sent)
    wire.done("")


def naive(pieces: list[str]) -> None:
    """Every delta's event, and the reply so far rendered at SAMPLES of them, evenly spread
    (rendering after every delta of the long reply takes minutes per run): scaled up below."""
    sent, text = Sent(), ""
    every = max(len(pieces) // SAMPLES, 1)
    for number, piece in enumerate(pieces):
        piece = sent.piece(piece)
        text += piece
        delta(piece, sent)
        if number % every == every - 1:
            render_markdown(text)


def measure(run: Callable[[list[str]], None], pieces: list[str], repeats: int) -> float:
    """Median CPU seconds of one run over ``pieces``."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        run(pieces)
        times.append(time.process_time() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print(f"Python {sys.version.split()[0]}; median of {args.repeats} runs, process CPU time\n")
    print("| reply | deltas | escaped µs/delta | blocks µs/delta | naive µs/delta "
          "| blocks ÷ escaped | naive ÷ blocks | final render ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, text in (("default (~170 tokens)", DEFAULT_TEXT), ("code-heavy", code_heavy())):
        pieces = tokenize(text)
        figures = {run.__name__: measure(run, pieces, args.repeats) / len(pieces) * 1e6
                   for run in (escaped, blocks, naive)}
        sampled = min(SAMPLES, len(pieces))
        renders = figures["naive"] - figures["escaped"]  # the sampled renderings, per delta
        figures["naive"] = figures["escaped"] + renders * len(pieces) / sampled
        final = measure(lambda _, text=text: render_markdown(text), pieces, args.repeats) * 1e3
        print(f"| {name}, {len(text):,} chars | {len(pieces):,} | {figures['escaped']:.1f} "
              f"| {figures['blocks']:.1f} | {figures['naive']:.0f} "
              f"| {figures['blocks'] / figures['escaped']:.1f}× "
              f"| {figures['naive'] / figures['blocks']:.0f}× | {final:.1f} |")


if __name__ == "__main__":
    main()

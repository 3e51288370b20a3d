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

Then the shapes that grow longest (``--part shapes``): one block of ``--size`` characters (a
list, a nested list, a paragraph of many lines or of one, a quote, indented code, a table, and
an odd one: lines that may end the block but do not), then a blank line and a short paragraph,
fed to a ``BlockTracker`` in the same token pieces: the whole reply's CPU (every parse and
rendering) against one rendering of its text, the costliest piece with its renderings left out,
and the characters handed to markdown-it's block parser (renderings included) per character.
It uses only ``feed`` and ``flush``: run at an older commit, it measures that tracker.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("DJANGO_DEBUG", "1")  # the demo's settings, as `make demo` runs them

import django

django.setup()

from markdown_it.rules_block.state_block import StateBlock  # noqa: E402

from chatstream.stream import Sent  # noqa: E402
from chatstream.testing import DEFAULT_TEXT  # noqa: E402
from chatstream.testing.scripts import tokenize  # noqa: E402
from chatstream.web import markdown_blocks  # noqa: E402
from chatstream.web.markdown_blocks import BlockTracker  # noqa: E402
from chatstream.web.rendering import render_markdown  # noqa: E402
from chatstream.web.wire import PageWire, delta  # noqa: E402

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


def repeated(line: Callable[[int], str], size: int) -> str:
    """Lines ``line(0)``, ``line(1)``... up to ``size`` characters or just over."""
    lines: list[str] = []
    length = 0
    while length < size:
        lines.append(line(len(lines)))
        length += len(lines[-1])
    return "".join(lines)


def shapes(size: int) -> dict[str, str]:
    """One long block of each shape, then a blank line and a short paragraph."""
    def indent(number: int) -> str:
        return " " * (len(str(number)) + 2)

    blocks = {
        "list": repeated(lambda n: f"- item number {n} of the list, with **bold** text\n", size),
        "nested list": repeated(lambda n: f"{n + 1}. Step {n}\n{indent(n + 1)}- detail *{n}*\n"
                                          f"{indent(n + 1)}- more `{n}`\n", size),
        "paragraph": repeated(lambda n: f"word{n} and more words, here and there\n", size),
        "one-line paragraph": repeated(lambda n: f"word{n} and more words, ", size) + "\n",
        "quote": repeated(lambda n: f"> quoted line {n}, with *emphasis*\n", size),
        "indented code": repeated(lambda n: f"    code_line({n})  # a comment\n", size),
        "table": "| a | b |\n|---|---|\n" + repeated(lambda n: f"| cell {n} | value {n} |\n", size),
        "odd: a `|||` line under each": repeated(lambda n: f"cell | {n}\n|||\n", size),
    }
    return {name: block + "\nAfter.\n" for name, block in blocks.items()}


class Counted:
    """While in use: CPU spent rendering blocks, characters handed to the block parser."""

    def __init__(self) -> None:
        self.rendering = 0.0
        self.parsed = 0

    def __enter__(self) -> Counted:
        self.render, self.start = markdown_blocks.render_markdown, StateBlock.__init__
        render, start = self.render, self.start

        def rendering(text: str, **options: Any) -> Any:
            began = time.process_time()
            try:
                return render(text, **options)
            finally:
                self.rendering += time.process_time() - began

        def parsing(state: StateBlock, text: str, *args: Any) -> None:
            self.parsed += len(text)
            start(state, text, *args)

        setattr(markdown_blocks, "render_markdown", rendering)  # noqa: B010
        setattr(StateBlock, "__init__", parsing)  # noqa: B010
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(markdown_blocks, "render_markdown", self.render)  # noqa: B010
        setattr(StateBlock, "__init__", self.start)  # noqa: B010


def tracked(pieces: list[str]) -> tuple[float, float, int]:
    """A tracker fed ``pieces``, then flushed: its CPU seconds in all, the most one piece took
    besides rendering, and the characters it and its renderings handed to the block parser."""
    tracker, worst = BlockTracker(), 0.0
    with Counted() as counted:
        began = time.process_time()
        for piece in pieces:
            start, rendering = time.process_time(), counted.rendering
            tracker.feed(piece)
            worst = max(worst, time.process_time() - start - (counted.rendering - rendering))
        tracker.flush()
        return time.process_time() - began, worst, counted.parsed


def rendering(text: str) -> float:
    """CPU seconds of one rendering of ``text``."""
    began = time.process_time()
    render_markdown(text)
    return time.process_time() - began


def main_shapes(size: int, repeats: int) -> None:
    print(f"\nOne block of {size:,} characters of each shape, then a short paragraph; median of "
          f"{repeats} runs\n")
    print("| shape | chars | pieces | tracker ms | one rendering ms | tracker ÷ rendering "
          "| costliest piece, renderings left out, ms | parsed ÷ chars |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, text in shapes(size).items():
        pieces = list(tokenize(text))
        runs = [tracked(pieces) for _ in range(repeats)]
        total = statistics.median(run[0] for run in runs) * 1e3
        worst = statistics.median(run[1] for run in runs) * 1e3
        render = statistics.median(rendering(text) for _ in range(repeats)) * 1e3
        print(f"| {name} | {len(text):,} | {len(pieces):,} | {total:.0f} | {render:.0f} "
              f"| {total / render:.1f}× | {worst:.1f} | {runs[0][2] / len(text):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--part", choices=("deltas", "shapes", "all"), default="all")
    parser.add_argument("--size", type=int, default=50_000, help="characters of each shape")
    args = parser.parse_args()
    print(f"Python {sys.version.split()[0]}; median of {args.repeats} runs, process CPU time\n")
    if args.part != "deltas":
        main_shapes(args.size, max(args.repeats // 3, 1))
    if args.part == "shapes":
        return
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

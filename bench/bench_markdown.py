"""What render_markdown costs per character on CommonMark's known pathological inputs.

Run: .venv/bin/python bench/bench_markdown.py [--sizes 12500,50000,200000] [--repeats N]
(not a test; tests/test_markdown_bounds.py holds each linear at 50,000 characters)

For each input of tests/pathological_markdown.py (cmark's pathological tests, and a few more
for the extensions chatstream enables: tables, strikethrough), the CPU µs per character of
``chatstream.web.rendering.render_markdown`` (markdown-it-py, then nh3) at each size, the least of
the repeats, and how many times the largest size costs the smallest per character: near 1 when
linear, about the sizes' ratio when quadratic.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("DJANGO_DEBUG", "1")  # the demo's settings, as `make demo` runs them

import django

django.setup()

import markdown_it  # noqa: E402
from bench_highlight import per_char  # noqa: E402  (its neighbour in bench/)

from chatstream.web.rendering import render_markdown  # noqa: E402
from tests.pathological_markdown import PATHOLOGICAL  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=lambda s: [int(n) for n in s.split(",")],
                        default=[12_500, 50_000, 200_000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"markdown-it-py {markdown_it.__version__}; CPU µs per character "
          f"(least of {args.repeats}), and largest / smallest")
    print(f"{'input':40}" + "".join(f"{size:>10,}" for size in args.sizes) + "  growth")
    for name, make in PATHOLOGICAL.items():
        costs = [per_char(render_markdown, make(size), repeats=args.repeats) for size in args.sizes]
        print(f"{name:40}" + "".join(f"{cost:10.2f}" for cost in costs)
              + f"  {costs[-1] / costs[0]:5.2f}", flush=True)


if __name__ == "__main__":
    main()

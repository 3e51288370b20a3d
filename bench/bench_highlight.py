"""What highlighting costs per character, and which Pygments lexers go superlinear on hostile code.

Run: .venv/bin/python bench/bench_highlight.py [--which NAME,...] [--own | --scan all|NAME,...]
(not a test; tests/test_highlight_bounds.py holds the listed lexers linear)

- Without ``--scan`` or ``--own``: for each lexer chatstream highlights with
  (``highlighting.highlighted_lexers()``, or ``--which``), the CPU µs per character of
  ``highlighting.highlighted`` as a reply's fence calls it, at ``HIGHLIGHT_LIMIT`` characters,
  on ordinary code in its language (tests/hostile_code.py's ``ORDINARY``, where it has some) and
  on its worst hostile input: every input of the screening corpus is lexed at ``--screen``
  characters, and the ``--top`` worst are measured again at the limit (least of
  ``--repeats``). ``--json`` writes each lexer's worst inputs, worst first.
- ``--own``: Pygments' own lexers against the windowed ones, in CPU seconds at the limit, on
  the typical input worst for Pygments' own (past ``--timeout`` seconds: shown as such).
- ``--compare DIR``: what windowing changes in the output, on the files of DIR/<alias>/
  (Pygments' own tests/examplefiles): the characters typed otherwise than Pygments' own does.
- ``--scan``: the lexers named (``all``: every lexer Pygments has; Pygments' own, or as
  chatstream uses them with ``--windowed``), each on the typical hostile inputs (``--corpus``:
  the screening corpus; with ``--full``, all of it) at two ``--sizes``. An input is
  *superlinear* for a lexer when the larger size costs more than ``--factor`` times the smaller
  and more than ``--floor`` seconds, or passes ``--timeout`` seconds. ``--json`` writes them.

Lexing is timed with a formatter that writes the text alone (Pygments' NullFormatter), except
without ``--scan`` or ``--own``, where chatstream's HTML formatter is.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("DJANGO_DEBUG", "1")  # the demo's settings, as `make demo` runs them

import django

django.setup()

import pygments  # noqa: E402
from pygments.formatters import NullFormatter  # noqa: E402
from pygments.lexer import Lexer  # noqa: E402
from pygments.lexers import LEXERS, find_lexer_class_by_name  # noqa: E402
from pygments.util import ClassNotFound  # noqa: E402

from chatstream.web import highlighting  # noqa: E402
from chatstream.web.highlighting import (  # noqa: E402
    LEXER_WINDOW,
    LONG_WINDOW,
    highlighted,
    highlighted_lexers,
    windowed,
)
from chatstream.web.rendering import HIGHLIGHT_LIMIT, _formatter  # noqa: E402
from tests.hostile_code import ORDINARY, corpus, typical  # noqa: E402


class _Timeout(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout


def lex_time(lexer: Lexer, text: str, *, timeout: float) -> float:
    """CPU seconds to lex ``text``; ``inf`` past ``timeout`` CPU seconds."""
    signal.setitimer(signal.ITIMER_PROF, timeout)
    start = time.process_time()
    try:
        highlighted(text, lexer, NullFormatter())
    except _Timeout:
        return float("inf")
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
    return time.process_time() - start


def lexers(which: str, *, as_used: bool) -> Iterator[tuple[str, Lexer]]:
    """(class name, instance) of the lexers ``which`` names, as ``rendering._lexer`` makes them
    when ``as_used``."""
    if which == "all":
        classes = [getattr(__import__(module, fromlist=[name]), name)
                   for name, (module, *_rest) in sorted(LEXERS.items())]
    elif which == "listed":
        classes = [cls for name, (module, *_rest) in sorted(LEXERS.items())
                   if name in highlighted_lexers()
                   for cls in [getattr(__import__(module, fromlist=[name]), name)]]
    else:
        classes = [find_lexer_class_by_name(name) for name in which.split(",")]
    for cls in classes:
        yield cls.__name__, (windowed(cls) if as_used else cls)(stripnl=False)


def scan(args: argparse.Namespace) -> None:
    signal.signal(signal.SIGPROF, _on_alarm)
    inputs = corpus(full=args.full) if args.corpus else typical()
    small, large = args.sizes
    report: dict[str, Any] = {}
    for name, lexer in lexers(args.scan, as_used=args.windowed):
        found = []
        start = time.process_time()
        for label, make in inputs.items():
            try:
                little = lex_time(lexer, make(small), timeout=args.timeout)
                big = lex_time(lexer, make(large), timeout=args.timeout) if little < 1e9 else little
            except Exception as error:  # a lexer's own bug on odd text
                found.append({"input": label, "error": repr(error)})
                continue
            if big == float("inf") or (big > args.factor * little and big > args.floor):
                # Once more, to tell a busy moment from the lexer.
                little = min(little, lex_time(lexer, make(small), timeout=args.timeout))
                big = min(big, lex_time(lexer, make(large), timeout=args.timeout))
            if big == float("inf") or (big > args.factor * little and big > args.floor):
                found.append({"input": label, "ratio": big / little if little else None,
                              "us_per_char": big * 1e6 / large})
        spent = time.process_time() - start
        found.sort(key=lambda f: -(f.get("us_per_char") or 0))
        report[name] = {"name": lexer.name, "aliases": lexer.aliases, "superlinear": found,
                                "seconds": spent}
        worst = found[0] if found else None
        print(f"{name:32} {spent:7.1f}s  {len(found):4} superlinear"
              + (f"  worst {worst['input']}: {worst.get('us_per_char', 0):.0f} µs/char"
                 if worst else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


def per_char(run: Any, text: str, *, repeats: int) -> float:
    """The least CPU µs per character of ``run(text)`` over ``repeats`` runs."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        run(text)
        best = min(best, time.process_time() - start)
    return best * 1e6 / len(text)


def listed(args: argparse.Namespace) -> None:
    """µs per character of each listed lexer, on ordinary code and on its worst hostile input."""
    signal.signal(signal.SIGPROF, _on_alarm)
    inputs = corpus(full=args.full)
    size = HIGHLIGHT_LIMIT
    worst_inputs: dict[str, list[str]] = {}
    print(f"Pygments {pygments.__version__}, LEXER_WINDOW {LEXER_WINDOW}, "
          f"LONG_WINDOW {LONG_WINDOW}; µs per character at {size:,} characters "
          f"(CPU, least of {args.repeats})")
    print(f"{'lexer':22} {'ordinary':>9} {'worst':>9}  worst input")
    for name, lexer in lexers(args.which or "listed", as_used=True):
        def run(text: str, lexer: Lexer = lexer) -> None:
            highlighted(text, lexer, _formatter())
        sample = ORDINARY.get(name)
        ordinary = (per_char(run, (sample * (size // len(sample) + 1))[:size],
                             repeats=args.repeats) if sample else float("nan"))
        screened = []
        for label, make in inputs.items():
            screened.append((lex_time(lexer, make(args.screen), timeout=args.timeout), label))
        screened.sort(reverse=True)
        # An input past the timeout at the screening size is not tried at the limit.
        top = [(float("inf") if cost == float("inf")
                else per_char(run, inputs[label](size), repeats=args.repeats), label)
               for cost, label in screened[:args.top]]
        worst, label = max(top)
        worst_inputs[name] = [label for _cost, label in sorted(top, reverse=True)]
        print(f"{name:22} {ordinary:9.1f} {worst:9.1f}  {label}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(worst_inputs, indent=1))


def own(args: argparse.Namespace) -> None:
    """Pygments' own lexers against the windowed ones, on the typical input that is worst for
    Pygments' own at the limit."""
    signal.signal(signal.SIGPROF, _on_alarm)
    inputs, size = typical(), HIGHLIGHT_LIMIT
    print(f"Pygments {pygments.__version__}; CPU seconds for {size:,} characters of the typical "
          f"input worst for Pygments' own lexer (found at {args.screen:,}; timeout "
          f"{args.timeout:g} s)")
    print(f"{'lexer':22} {'input':34} {'Pygments':>10} {'windowed':>10}")
    for name, lexer in lexers(args.which or "listed", as_used=False):
        screened = max((lex_time(lexer, make(args.screen), timeout=args.timeout), label)
                       for label, make in inputs.items())
        label = screened[1]
        text = inputs[label](size)
        mine = windowed(type(lexer))(stripnl=False)
        costs = [lex_time(each, text, timeout=args.timeout) for each in (lexer, mine)]
        shown = [f"> {args.timeout:g}" if cost == float("inf") else f"{cost:.2f}"
                 for cost in costs]
        print(f"{name:22} {label:34} {shown[0]:>10} {shown[1]:>10}", flush=True)


def compare(args: argparse.Namespace) -> None:
    """What windowing changes: the characters each listed lexer types otherwise than Pygments'
    own does, in the files of ``--compare`` (a directory of <alias>/<file>, as Pygments' own
    tests/examplefiles), each cut at the limit."""
    def types(lexer: Lexer, code: str) -> list[Any]:
        with_looks = highlighting._LONG_LOOKS.set([4 + len(code) // highlighting.LONG_LOOK_EVERY])
        try:
            return [kind for kind, text in lexer.get_tokens(code) for _ in text]
        finally:
            highlighting._LONG_LOOKS.reset(with_looks)
    files = changed = characters = differing = 0
    for path in sorted(Path(args.compare).glob("*/*")):
        if path.suffix == ".output":  # Pygments' expected tokens, beside each example
            continue
        try:
            cls = find_lexer_class_by_name(path.parent.name)
            code = path.read_text(encoding="utf-8")[:HIGHLIGHT_LIMIT]
        except (ClassNotFound, UnicodeDecodeError):
            continue
        if cls.__name__ not in highlighted_lexers():
            continue
        own, mine = types(cls(stripnl=False), code), types(windowed(cls)(stripnl=False), code)
        differ = sum(a != b for a, b in zip(own, mine, strict=False)) + abs(len(own) - len(mine))
        files, characters = files + 1, characters + len(own)
        if differ:
            changed, differing = changed + 1, differing + differ
            print(f"{path.parent.name}/{path.name}: {differ:,} of {len(own):,} characters")
    print(f"{changed} of {files} files differ; {differing:,} of {characters:,} characters "
          f"({100 * differing / max(characters, 1):.2f} %)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scan", help="all, listed, or lexer names: find superlinear ones")
    parser.add_argument("--which", help="listed (default) or lexer names, without --scan")
    parser.add_argument("--sizes", type=lambda s: [int(n) for n in s.split(",")],
                        default=[500, 2000])
    parser.add_argument("--full", action="store_true", help="the whole hostile corpus")
    parser.add_argument("--corpus", action="store_true",
                        help="--scan with the corpus (screening set, or --full) not the typical")
    parser.add_argument("--windowed", action="store_true",
                        help="--scan the lexers as chatstream uses them (else Pygments' own)")
    parser.add_argument("--factor", type=float, default=8.0)
    parser.add_argument("--floor", type=float, default=0.002,
                        help="CPU seconds at the larger size below which nothing is flagged")
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--screen", type=int, default=4096,
                        help="size at which every input is tried, to find the worst")
    parser.add_argument("--top", type=int, default=3,
                        help="the worst inputs at --screen measured again at the limit")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--own", action="store_true",
                        help="Pygments' own lexers against the windowed ones, at the limit")
    parser.add_argument("--compare", metavar="DIR",
                        help="what windowing changes in the files of DIR/<alias>/")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.scan:
        scan(args)
    elif args.own:
        own(args)
    elif args.compare:
        compare(args)
    else:
        listed(args)


if __name__ == "__main__":
    main()

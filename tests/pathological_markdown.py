"""Markdown known to make CommonMark parsers superlinear, at any length.

CommonMark's reference implementation keeps these inputs as its pathological tests (nested
brackets and emphasis, closers without openers, deep quotes and lists, many backticks, unclosed
links, many references...). Shared by tests/test_markdown_bounds.py and bench/bench_markdown.py.
"""

from __future__ import annotations

from collections.abc import Callable

Make = Callable[[int], str]


def _times(piece: str) -> Make:
    return lambda size: piece * max(size // len(piece), 1)


def _around(opening: str, middle: str, closing: str) -> Make:
    return lambda size: (opening * (size // (len(opening) + len(closing)))
                         + middle + closing * (size // (len(opening) + len(closing))))


def _deep_list(size: int) -> str:
    lines, used, depth = [], 0, 0
    while used < size:
        line = "  " * depth + "* a\n"
        lines.append(line)
        used += len(line)
        depth += 1
    return "".join(lines)


def _backticks(size: int) -> str:
    parts, used, run = [], 0, 1
    while used < size:
        parts.append("e" + "`" * run)
        used += run + 1
        run += 1
    return "".join(parts)


def _references(size: int) -> str:
    definitions, used, n = [], 0, 1
    while used < size // 2:
        line = f"[{n}]: u\n"
        definitions.append(line)
        used += len(line)
        n += 1
    return "".join(definitions) + "\n" + "[0] " * (size // 8)


def _wide_table(size: int) -> str:
    columns = size // 12
    return "| a " * columns + "|\n" + "|---" * columns + "|\n" + "| b " * columns + "|\n"


def _long_table(size: int) -> str:
    return "| a | b |\n|---|---|\n" + "| c |\n" * (size // 6)


PATHOLOGICAL: dict[str, Make] = {
    "nested strong emph": _around("*a **a ", "b", " a** a*"),
    "many emph closers with no openers": _times("a_ "),
    "many emph openers with no closers": _times("_a "),
    "many link closers with no openers": _times("a]"),
    "many link openers with no closers": _times("[a"),
    "mismatched openers and closers": _times("*a_ "),
    "openers and closers multiple of 3": lambda size: "a**b" + "c* " * (size // 3),
    "link openers and emph closers": _times("[ a_"),
    "pattern [ (]( repeated": _times("[ (]("),
    "pattern ![[]() repeated": _times("![[]()"),
    "nested brackets": _around("[", "a", "]"),
    "nested parentheses in a link": lambda size: "[a](" + "(" * (size // 2) + ")" * (size // 2)
    + ")",
    "nested block quotes": lambda size: "> " * (size // 2) + "a",
    "deeply nested lists": _deep_list,
    "deeply nested ordered lists": lambda size: "".join(
        "   " * depth + "1. a\n" for depth in range(int((2 * size / 3) ** 0.5))),
    "U+0000 in input": _times("abc\x00de\x00"),
    "backticks": _backticks,
    "unclosed links A": _times("[a](<b"),
    "unclosed links B": _times("[a](b"),
    "unclosed link titles": _times('[a](b "c'),
    "many references": _references,
    "many strikethrough openers": _times("~~a "),
    "strikethrough and emph mixed": _times("~~*a_ "),
    "many tildes": _times("a~"),
    "wide table": _wide_table,
    "long table of short rows": _long_table,
    "many hard breaks": _times("a  \n"),
    "many setext underlines": _times("a\n=\n"),
    "many entities": _times("&amp;&#123;&#x1F600;"),
    "many escapes": _times("\\*\\_\\["),
    "many autolinks": _times("<http://a.b>"),
    "unclosed autolinks": _times("<http://a"),
    "many code spans": _times("`a`"),
    "unclosed fences": _times("```\n"),
    "fence inside quotes": lambda size: "> ```\n" * (size // 6),
    "many images": _times("![a](b)"),
    "deep emphasis of one char": _around("*", "a", "*"),
    "deep strong underscore": _around("__", "a", "__"),
}

"""Code highlighted by Pygments in time linear in its length, whatever its language and text.

A fence names its language, and the model writes both the name and the code, so both are
hostile. Two things bound what highlighting costs:

- Only the lexers of ``HIGHLIGHTED_LEXERS`` are used (each by any of its names: ``py``,
  ``sh``, ``c++``...); a fence naming another language is shown plain. Each listed lexer is held
  linear on hostile code up to ``rendering.HIGHLIGHT_LIMIT`` characters by
  tests/test_highlight_bounds.py; bench/bench_highlight.py measures it.
- Each lexer is *windowed*. Pygments tries its lexers' patterns at each position of the code,
  and many (a string's in one pattern, a docstring's after any blank lines, a C function's
  head) scan far ahead before failing: on a long run of what they scan, each position costs
  as much as the run, which is quadratic (a few KB of blank lines took seconds). Here a pattern
  tried at a position sees only the next ``LEXER_WINDOW`` characters, so each position costs
  at most a window's scan. A token may still be longer: a pattern that hands what it matches to
  another lexer (an HTML ``<script>``'s body to JavaScript's, itself windowed), or whose match
  begins with a distinctive opener (a quote, ``/*``, ``<!--``, ``#``...) and was cut by the
  window, may look ``LONG_WINDOW`` characters far, a few times per block (4, and one more per
  ``LONG_LOOK_EVERY`` characters). A token longer than that, or one whose pattern refers back
  to its own start (a shell heredoc, a Lua long comment), may be highlighted in pieces, some
  as code; its text is always kept exactly.

A few lexers hold only from some release of Pygments on (``LINEAR_FROM``); before it they are
left off. What windowing costs and changes is measured in bench/README.md ("Highlighting").
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from functools import cache, lru_cache
from typing import Any, cast

import pygments
from pygments import highlight
from pygments.formatter import Formatter
from pygments.lexer import Lexer, bygroups, using
from pygments.lexers import LEXERS, find_lexer_class_by_name

# The Pygments lexers a fence may choose, by class name: each is Pygments' own, found in every
# supported release (2.16 on), and held linear by tests/test_highlight_bounds.py. Others are
# superlinear on some text even windowed (Scala's string pattern is exponential on backslashes
# after a quote), or hand code to a lexer they pick by name (Markdown's fences), or are seldom
# asked for; bench/README.md ("Highlighting") has the scan of them all.
HIGHLIGHTED_LEXERS = frozenset({
    "BashLexer", "BatchLexer", "CLexer", "CMakeLexer", "CSharpLexer", "CppLexer", "CssLexer",
    "DartLexer", "DiffLexer", "DockerLexer", "ElixirLexer", "ErlangLexer", "GoLexer",
    "GraphQLLexer", "GroovyLexer", "HaskellLexer", "HtmlLexer", "IniLexer", "JavaLexer",
    "JavascriptLexer", "JsonLexer", "JuliaLexer", "KotlinLexer", "LuaLexer", "MatlabLexer",
    "NginxConfLexer", "NixLexer", "PerlLexer", "PhpLexer", "PowerShellLexer", "ProtoBufLexer",
    "PythonLexer", "RubyLexer", "RustLexer", "SLexer", "SolidityLexer",
    "SqlLexer", "SwiftLexer", "TOMLLexer", "TexLexer", "TypeScriptLexer",
    "XmlLexer", "YamlLexer", "ZigLexer",
})
# Listed lexers that are superlinear even windowed before a Pygments release (a Ruby heredoc's
# end is looked for in the whole code, at each heredoc, before 2.21): highlighted from it on.
LINEAR_FROM = {"RubyLexer": (2, 21)}
LEXER_WINDOW = 128
LONG_WINDOW = 4096
LONG_LOOK_EVERY = 256

Rule = tuple[Callable[..., Any], Any, Any]  # a compiled pattern's match, its action, new state

# The long looks a block has left, while it is highlighted (None: none at all).
_LONG_LOOKS: ContextVar[list[int] | None] = ContextVar("chatstream_long_looks", default=None)
_SPECIAL = frozenset(".^$*+?{}[]()|\\")
_BACKREFERENCE = re.compile(r"\\[1-9]|\(\?P=")
_UNBOUNDED = re.compile(r"\{\d*,\}")


@lru_cache(maxsize=256)  # the names are the model's: unknown ones are cached too, and bounded
def lexer_named(name: str) -> Lexer | None:
    """The listed lexer called ``name`` (any alias, any case), windowed; never a guess from
    the code (slow, and often wrong)."""
    listed = _listed_aliases().get(name.lower())
    if listed is None:
        return None  # and no other lexer's module is imported
    lexer = find_lexer_class_by_name(name)
    if lexer.__name__ != listed or not lexer.__module__.startswith("pygments.lexers."):
        return None
    # stripnl=False: the code is shown (and copied) with its blank first lines.
    return windowed(lexer)(stripnl=False)


def highlighted_lexers() -> frozenset[str]:
    """The listed lexers this release of Pygments highlights with (LINEAR_FROM)."""
    release = tuple(int(part) for part in pygments.__version__.split(".")[:2])
    return frozenset(lexer for lexer in HIGHLIGHTED_LEXERS
                     if release >= LINEAR_FROM.get(lexer, (0, 0)))


@cache
def _listed_aliases() -> dict[str, str]:
    """Each alias of a listed lexer, and that lexer's class name: Pygments' own lexers only, the
    first of them to have the alias (as Pygments looks them up; a plugin's come after)."""
    owners: dict[str, str] = {}
    for lexer, (_module, _name, aliases, *_rest) in LEXERS.items():
        for alias in aliases:
            owners.setdefault(alias.lower(), lexer)
    listed = highlighted_lexers()
    return {alias: lexer for alias, lexer in owners.items() if lexer in listed}


def highlighted(code: str, lexer: Lexer, formatter: Formatter) -> str:
    """``code`` highlighted by ``lexer`` (a windowed one) with its long looks counted."""
    token = _LONG_LOOKS.set([4 + len(code) // LONG_LOOK_EVERY])
    try:
        return str(highlight(code, lexer, formatter))
    finally:
        _LONG_LOOKS.reset(token)


@cache
def windowed(lexer: type[Lexer]) -> type[Lexer]:
    """``lexer`` with its patterns windowed, and the lexers it hands code to."""
    attributes: dict[str, Any] = {}
    inner = getattr(lexer, "_innerLexerCls", None)  # a shell session's shell
    if isinstance(inner, type) and issubclass(inner, Lexer):
        attributes["_innerLexerCls"] = windowed(inner)
    made = types.new_class(lexer.__name__, (_Windowed, lexer),
                           exec_body=lambda namespace: namespace.update(attributes))
    return cast("type[Lexer]", made)


class _Windowed:
    """Windows a RegexLexer's patterns (on each instance: some lexers pick their patterns as
    they are made); any other lexer is left as it is."""

    _tokens: dict[str, list[Rule]]

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        if isinstance(getattr(self, "_tokens", None), dict):
            self._tokens = _windowed_rules(self._tokens)


_WINDOWED: dict[int, tuple[object, dict[str, list[Rule]]]] = {}


def _windowed_rules(tokens: dict[str, list[Rule]]) -> dict[str, list[Rule]]:
    try:
        return _WINDOWED[id(tokens)][1]
    except KeyError:
        rules = {state: [_windowed_rule(*rule) for rule in state_rules]
                 for state, state_rules in tokens.items()}
        _WINDOWED[id(tokens)] = (tokens, rules)  # the original kept, so its id is not reused
        return rules


def _windowed_rule(match: Callable[..., Any], action: Any, new_state: Any) -> Rule:
    pattern = getattr(match, "__self__", None)
    if not isinstance(pattern, re.Pattern) or not isinstance(pattern.pattern, str):
        return _window(match, (), fold=False), action, new_state
    openers = _openers(pattern)
    fold = bool(pattern.flags & re.IGNORECASE)
    handover = _handover(action)
    if handover is not None:
        return _window(match, openers or ("",), fold=fold), handover, new_state
    if not _repeats(pattern.pattern):
        return match, action, new_state  # it matches a few characters at most: as it is
    openers = tuple(filter(_distinctive, openers))
    return _window(match, openers, fold=fold), action, new_state


def _window(match: Callable[..., Any], openers: tuple[str, ...], *,
            fold: bool) -> Callable[..., Any]:
    """``match`` (a compiled pattern's) looking LEXER_WINDOW characters ahead, and LONG_WINDOW
    when that cut it short where the text begins with one of ``openers`` (in any case when
    ``fold``), while the block has long looks left."""
    longest = max(map(len, openers), default=0)

    def begins(text: str, pos: int) -> bool:
        if fold:
            return text[pos:pos + longest].lower().startswith(openers)
        return text.startswith(openers, pos)

    def windowed(text: str, pos: int, endpos: int | None = None) -> Any:
        end = pos + LEXER_WINDOW if endpos is None else min(endpos, pos + LEXER_WINDOW)
        found = match(text, pos, end)
        if not openers or (found is not None and found.end() < end):
            return found
        if (end < len(text) and (endpos is None or end < endpos) and begins(text, pos)
                and _long_look()):
            limit = pos + LONG_WINDOW if endpos is None else min(endpos, pos + LONG_WINDOW)
            return match(text, pos, limit) or found
        return found
    return windowed


def _distinctive(opener: str) -> bool:
    """Whether a long look is worth spending where a pattern's text begins with ``opener``: a
    quote or a comment's character, or punctuation of more than one character (``/*``,
    ``<!--``). Not a word or a number (seldom one long token), nor a "<" or a "(" (many
    patterns begin with one and fail at once)."""
    if opener in ('"', "'", "`", "#", "%", ";"):
        return True
    return len(opener) > 1 and not opener.replace("_", "a").isalnum()


def _long_look() -> bool:
    left = _LONG_LOOKS.get()
    if not left or left[0] <= 0:
        return False
    left[0] -= 1
    return True


def _openers(pattern: re.Pattern[str]) -> tuple[str, ...]:
    """Texts a match of ``pattern`` begins with, as its source says plainly (``/*``, ``<!--``, a
    quote; ``ENV`` or ``ARG``): where the text begins with one, a long look may be worth it.
    None when a long look could cost more than a scan (a backreference: each start of the
    group it refers to scans again)."""
    if pattern.flags & re.VERBOSE or _BACKREFERENCE.search(pattern.pattern):
        return ()
    return _source_openers(pattern.pattern, ignore_case=bool(pattern.flags & re.IGNORECASE))


def _source_openers(source: str, *, ignore_case: bool) -> tuple[str, ...]:
    openers: list[str] = []
    for branch in _branches(source):
        if branch.startswith("(?:") or (branch.startswith("(") and not branch.startswith("(?")):
            end = _group_end(branch)
            if branch[end + 1:end + 2] in ("?", "*", "{") and end + 1 < len(branch):
                return ()  # the group may be absent
            inner = _source_openers(branch[3 if branch[1] == "?" else 1:end],
                                    ignore_case=ignore_case)
        else:
            inner = (_literal(branch, ignore_case=ignore_case),)
        if not all(inner):
            return ()
        openers.extend(inner)
    return tuple(openers)


def _literal(source: str, *, ignore_case: bool) -> str:
    """The plain characters ``source`` (a pattern) begins with."""
    literal, at = "", 0
    while at < len(source):
        char, step = source[at], 1
        if char == "\\":
            if at + 1 == len(source) or source[at + 1].isalnum():
                break  # a class (\d), an escape (\n) or an anchor (\b)
            char, step = source[at + 1], 2
        elif char == "[" and source[at + 2:at + 3] == "]" and source[at + 1] not in "^\\]":
            char, step = source[at + 1], 3  # a class of one character: [*]
        elif char == "(" and literal:
            end = at + _group_end(source[at:])
            if source[end + 1:end + 2] != "?":
                break
            at = end + 2  # read on as if the optional group were absent: /(\\\n)?[*] is /*
            continue
        elif char in _SPECIAL:
            break
        after = source[at + step:at + step + 1]
        if after and after in "*?{":
            break  # this character may be absent
        literal += char.lower() if ignore_case else char
        at += step
        if after == "+":
            break
    return literal


def _repeats(source: str) -> bool:
    """Whether ``source`` (a pattern) repeats anything without bound (``*``, ``+``, ``{2,}``)."""
    return any(char in "*+" or (char == "{" and _UNBOUNDED.match(source, at))
               for at, char, _depth in _walk(source))


def _branches(source: str) -> list[str]:
    """``source`` (a pattern) split at its alternatives outside any group."""
    bars = [at for at, char, depth in _walk(source) if char == "|" and depth == 0]
    return [source[start:end] for start, end in zip([0] + [at + 1 for at in bars],
                                                    [*bars, len(source)], strict=True)]


def _group_end(source: str) -> int:
    """Where the group ``source`` (a pattern) begins with ends: its ")"."""
    return next((at for at, char, depth in _walk(source) if char == ")" and depth == 0),
                len(source))


def _walk(source: str) -> Iterator[tuple[int, str, int]]:
    """Each character of ``source`` (a pattern) outside its character classes, with where it is
    and how deep in groups (a "(" inside the group it opens, a ")" outside the one it closes);
    an escaped character is given as its backslash alone."""
    depth, at = 0, 0
    while at < len(source):
        char = source[at]
        if char == "[":
            at = _past_class(source, at)
            continue
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        yield at, char, depth
        at += 2 if char == "\\" else 1


def _past_class(source: str, at: int) -> int:
    """Where the character class opened at ``at`` in ``source`` ends, past its "]"."""
    at += 1
    if source[at:at + 1] == "^":
        at += 1
    if source[at:at + 1] == "]":  # first, a "]" is a member
        at += 1
    while at < len(source) and source[at] != "]":
        at += 2 if source[at] == "\\" else 1
    return at + 1


def _handover(action: Any) -> Any:
    """``action`` made to hand what it matched to windowed lexers, when it hands it to another
    lexer (Pygments' ``using``, alone or in ``bygroups``); else None."""
    if not inspect.isfunction(action):
        return None
    names = inspect.getclosurevars(action).nonlocals
    other = names.get("_other")
    if isinstance(other, type) and issubclass(other, Lexer) and "kwargs" in names:
        options = dict(names["kwargs"])
        stack = names.get("gt_kwargs", {}).get("stack")
        if stack is not None:
            options["state"] = stack
        return using(windowed(other), **options)
    inner = names.get("args")
    if action.__qualname__.startswith("bygroups.") and isinstance(inner, tuple):
        handovers = [_handover(each) or each for each in inner]
        if handovers != list(inner):
            return bygroups(*handovers)
    return None

"""Highlighting costs time linear in the code, whatever the language a fence names and its code.

Speed is never asserted. Linearity is shown by the CPU time of two sizes of one input
(tests/cpu_time.py); the bound by the CPU time of each listed lexer's worst input against ordinary
code of the same length, in the same process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from pygments.formatters import NullFormatter
from pygments.lexer import Lexer
from pygments.lexers import LEXERS, find_lexer_class_by_name

from chatstream.web import highlighting
from chatstream.web.highlighting import (
    HIGHLIGHTED_LEXERS,
    LINEAR_FROM,
    highlighted,
    highlighted_lexers,
    windowed,
)
from chatstream.web.rendering import _LANGUAGE, HIGHLIGHT_LIMIT, _formatter, render_markdown

from .cpu_time import LINEAR, REPEATS, cpu_seconds, growth
from .hostile_code import ORDINARY, corpus, opened, run, typical

QUARTER = HIGHLIGHT_LIMIT // 4
BOUND = 40  # the most times ordinary Python code's CPU time code of its length may cost
# The fuzz test tries each lexer at a quarter of these sizes, with windows still far smaller
# than both: the same growth as at the limit, in a quarter of the time.
SCALE = 4
WINDOWS = {"LEXER_WINDOW": 32, "LONG_WINDOW": 128}

# A few lines every listed lexer marks some token of.
SAMPLE = 'x = 1 # one\n+ "two" 3\n- <a>{b}</a>\n'
# The two worst inputs of tests/hostile_code.py that bench/bench_highlight.py found for each
# listed lexer (2026-12-03, Pygments 2.21), worst first.
WORST: dict[str, list[str]] = {
    "BashLexer": ["nested (**)", "nested <a></a>"],
    "BatchLexer": ["run '&a'", "run '#|'"],
    "CLexer": ["nested <a></a>", "nested `${}`"],
    "CMakeLexer": ["nested (**)", "nested `${}`"],
    "CSharpLexer": ["run 'a\\n'", "nested `${}`"],
    "CppLexer": ["nested `${}`", "nested <a></a>"],
    "CssLexer": ["'${' then 'a'", "'`${' then 'a'"],
    "DartLexer": ["nested `${}`", "nested <a></a>"],
    "DiffLexer": ["nested <a></a>", "nested `${}`"],
    "DockerLexer": ["run '\\n '", "run '\\n\\t'"],
    "ElixirLexer": ["nested `${}`", "nested ${}"],
    "ErlangLexer": ["'#{' then '\\\\'", "'(*' then '\\\\'"],
    "GoLexer": ["nested ${}", "nested (**)"],
    "GraphQLLexer": ["nested `${}`", "nested ${}"],
    "GroovyLexer": ["'`' then '\\n'", "nested `${}`"],
    "HaskellLexer": ["nested (**)", "nested `${}`"],
    "HtmlLexer": ["run '&'", "run '<'"],
    "IniLexer": ["'[' then 'a'", "'[[' then ' '"],
    "JavaLexer": ["'^' then '\\n'", "'&' then '\\n'"],
    "JavascriptLexer": ['run "\\\\\'"', "nested (**)"],
    "JsonLexer": ["nested `${}`", "nested <a></a>"],
    "JuliaLexer": ["run '@'", 'run "\'"'],
    "KotlinLexer": ["nested (**)", "nested `${}`"],
    "LuaLexer": ["nested `${}`", "nested <a></a>"],
    "MatlabLexer": ["nested `${}`", "nested <a></a>"],
    "NginxConfLexer": ["run ';'", "run '}'"],
    "NixLexer": ["run 'a.'", "run '.'"],
    "PerlLexer": ['run \'\\\\"\'', "nested (**)"],
    "PhpLexer": ["run '<?'", "run '<?php '"],
    "PowerShellLexer": ["run '*'", "nested <a></a>"],
    "ProtoBufLexer": ["run '\\n'", "run '@'"],
    "PythonLexer": ["run '$a'", "nested `${}`"],
    "RubyLexer": ["'!' then '\\\\'", "nested (**)"],
    "RustLexer": ["nested (**)", "nested <a></a>"],
    "SLexer": ['"f\'" then \' \'', '\'f"\' then \'a\''],
    "SolidityLexer": ["nested `${}`", "nested <a></a>"],
    "SqlLexer": ["nested `${}`", "nested (**)"],
    "SwiftLexer": ["nested `${}`", "run 'a='"],
    "TOMLLexer": ["nested `${}`", "nested /**/"],
    "TexLexer": ["run '&a'", "nested `${}`"],
    "TypeScriptLexer": ["run 'a.'", 'run \'\\\\"\''],
    "XmlLexer": ["run '&'", "'<' then 'a'"],
    "YamlLexer": ["run '[a'", "run '``'"],
    "ZigLexer": ["nested `${}`", "nested (**)"],
}


def _listed() -> Iterator[type[Lexer]]:
    for name, (module, *_rest) in sorted(LEXERS.items()):
        if name in highlighted_lexers():
            yield getattr(__import__(module, fromlist=[name]), name)


LISTED = list(_listed())


def _lex(lexer: Lexer) -> Callable[[str], object]:
    return lambda text: highlighted(text, lexer, NullFormatter())


def _highlighted(html: str) -> bool:
    return '<span class="' in html.split("<pre>", 1)[1]


def test_listed_lexers_are_pygments_own_and_found_in_this_release():
    assert HIGHLIGHTED_LEXERS <= set(LEXERS)
    assert set(LINEAR_FROM) <= HIGHLIGHTED_LEXERS
    assert {cls.__name__ for cls in LISTED} == highlighted_lexers()


@pytest.mark.parametrize("name", ["autohotkey", "ahk", "markdown", "Tcl", "vbnet"])
def test_fence_naming_a_language_off_the_list_is_shown_plain_with_its_label(name):
    html = render_markdown(f"```{name}\nMsgBox, Hello #world\n\n  x := 1 ; done\n```")
    assert f'<span class="cs-code-lang">{name}</span>' in html
    assert f'<code class="language-{name}">MsgBox, Hello #world\n\n  x := 1 ; done\n' in html
    assert not _highlighted(html)


def test_every_alias_of_a_listed_lexer_highlights_and_no_other_name_does():
    owners: dict[str, str] = {}  # each alias: the first of Pygments' lexers to have it
    for name, (_module, _title, aliases, *_rest) in LEXERS.items():
        for alias in aliases:
            owners.setdefault(alias.lower(), name)
    for alias, name in owners.items():
        if _LANGUAGE.fullmatch(f"language-{alias}"):  # else not a fence's label
            html = render_markdown(f"```{alias}\n{SAMPLE}```")
            assert _highlighted(html) == (name in highlighted_lexers()), (alias, name)


@pytest.mark.parametrize(("language", "make"), [
    ("autohotkey", run("\n")),
    ("python", opened(":", " \n")),
    ("js", run("'\\")),
    ("typescript", run("a.")),
    ("bash", opened("<<", "a")),
    ("css", opened("`${", "a")),
], ids=["autohotkey-blank-lines", "python-blank-lines-of-spaces", "js-escaped-apostrophes",
        "typescript-dotted-names", "bash-heredoc-word", "css-template-openers"])
def test_a_fence_of_hostile_code_renders_in_time_linear_in_its_length(language, make):
    def work(code: str) -> str:
        return render_markdown(f"```{language}\n{code}\n```")
    def fenced(size: int) -> str:  # what the fence holds: the code and its newline
        return make(size - 1)
    assert growth(work, fenced, HIGHLIGHT_LIMIT) < LINEAR
    listed = language != "autohotkey"
    assert _highlighted(work(fenced(HIGHLIGHT_LIMIT))) == listed  # highlighted up to the limit


LONG_TOKENS = {
    "html": "<p>x</p>\n<script>\n" + "  const total = items.reduce((a, b) => a + b); // sum\n" * 40
            + "</script>\n<style>\n" + "  body { margin: 0; color: #333; }\n" * 40 + "</style>\n",
    "c": "/*\n" + " * A comment longer than a window, with words: if (x) return;\n" * 30 + " */\n"
         "int main(void) { return 0; }\n",
    "javascript": 'const s = "' + "a long string, " * 80 + '";\nlet n = 1;\n',
    "python": "x = 1  # " + "a long comment " * 80 + "\ny = 2\n",
}


@pytest.mark.parametrize("language", LONG_TOKENS)
def test_tokens_longer_than_a_window_are_highlighted_as_pygments_does(language):
    code = LONG_TOKENS[language]
    lexer = find_lexer_class_by_name(language)
    own = highlighted(code, lexer(stripnl=False), _formatter())
    assert highlighted(code, windowed(lexer)(stripnl=False), _formatter()) == own
    assert len(code) > 8 * highlighting.LEXER_WINDOW  # a token far longer than a window


@pytest.fixture
def scaled_windows(monkeypatch):
    """Windows far smaller than the sizes tried, as at the limit: a token a window lets grow
    (a long look's) is then a small part of either size, and the growth that of the rest."""
    for name, size in WINDOWS.items():
        monkeypatch.setattr(highlighting, name, size)


@pytest.mark.parametrize("lexer", LISTED, ids=lambda cls: cls.__name__)
def test_listed_lexer_is_linear_on_hostile_code(scaled_windows, lexer):
    work = _lex(windowed(lexer)(stripnl=False))
    inputs = {**typical(), **{name: corpus()[name] for name in WORST.get(lexer.__name__, [])}}
    grown = {name: growth(work, make, HIGHLIGHT_LIMIT // SCALE) for name, make in inputs.items()}
    assert {name: round(times, 1) for name, times in grown.items() if times >= LINEAR} == {}


def test_the_worst_code_found_costs_at_most_forty_times_ordinary_code():
    """Each listed lexer's worst input found costs at most BOUND times what ordinary Python
    code of the same length does (bench/bench_highlight.py measures both): measured again,
    up to REPEATS times, only when over."""
    def cost(lexer: Lexer, text: str) -> float:
        return cpu_seconds(lambda code: highlighted(code, lexer, _formatter()), text)
    python = ORDINARY["PythonLexer"]
    reference = (python * (QUARTER // len(python) + 1))[:QUARTER]
    ordinary = min(cost(windowed(find_lexer_class_by_name("python"))(stripnl=False), reference)
                   for _ in range(REPEATS))
    worst = {}
    for lexer in LISTED:
        for name in WORST.get(lexer.__name__, [])[:1]:
            text, made = corpus()[name](QUARTER), windowed(lexer)(stripnl=False)
            times = float("inf")
            for _ in range(REPEATS):
                times = min(times, cost(made, text) / ordinary)
                if times <= BOUND:
                    break
            worst[f"{lexer.__name__}: {name}"] = times
    assert {name: round(times, 1) for name, times in worst.items() if times > BOUND} == {}

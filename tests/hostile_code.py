"""Code a model could write to make a syntax highlighter slow: each input at any length.

Shared by the lexer fuzz test (tests/test_highlight_bounds.py) and the lexer scan and benchmark
(bench/bench_highlight.py). Pygments lexers are regular expressions tried at each position; the
ones that go superlinear do so on long runs that a pattern scans to the end and then gives back
(blank lines, spaces, an unterminated string or comment, nested brackets, backslashes), so each
input here is such a run, or a random mix of the characters that open and close them.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable

Make = Callable[[int], str]

# What opens a string, comment, heredoc, template or block in some language, left unclosed.
OPENERS = (
    '"', "'", "`", '"""', "'''", "/*", "/**", "//", "#", "--", ";", "%", "!", "<!--", "(*", "{-",
    "#|", "--[[", "[[", "<<EOF\n", "<<'EOF'\n", "<<-EOF\n", "<<~EOF\n", "$(", "${", "$((", "`${",
    "@\"", "r\"", "r#\"", "b\"", "f\"", "f'", 'R"(', "%q(", "%w[", "q{", "qw(", "=begin\n",
    "<![CDATA[", "<?php ", "<?", "<", "<a ", "</", "[", "{", "(", "@", "$", "\\", "```", "|",
    "#{", "{{", "{%", "<%", "<<", "#!", "0x", "1e", "'\\", '"\\', "/", "~", "^", "&", ":",
)
# What follows an opener: plain text, blanks, line ends, escapes, or the opener's own kind.
FILLERS = ("a", " ", "\t", "\n", "a\n", " \n", "\\", "\\\n", "a b ", "a'", 'a"', "$a", "}\n")
# Sequences whose repetition makes one token per character or two, in many lexers.
PAIRS = (
    "a ", "a\n", " \n", "a.", "a,", "a:", "1.", "1 ", "::", "->", "=>", "<-", "<=", "</", "/>",
    "\\n", "\\\\", "\\'", '\\"', "''", '""', "``", "()", "[]", "{}", "<>", "!=", "*/", "--", "//",
    "$a", "@a", "#a", "%a", "&a", "a=", "a;", ". ", " \t", "\t ", "\r\n", "\n ", "\n\t",
    "'a'", '"a"', "`a`", "/a/", "(a", "[a", "{a", "a)", "a]", "a}", "<a", "a>",
)
# Alphabets for the random mixes: punctuation that opens and closes things, blanks, quotes
# and escapes, everything printable.
ALPHABETS = {
    "brackets": "()[]{}<> \n",
    "blanks": " \t\n\r\\",
    "quotes": "\"'`\\ \n$#{}/*",
    "operators": "=+-*/%<>!&|^~?:;.,@#",
    "printable": string.printable,
    "words": "ab1 _\n.\"'",
}
MIX_SEEDS = (1, 2)


def run(piece: str) -> Make:
    """``piece`` repeated."""
    return lambda size: (piece * (size // len(piece) + 1))[:size]


def opened(opener: str, filler: str) -> Make:
    """``opener`` once, then ``filler`` repeated."""
    return lambda size: opener + run(filler)(max(size - len(opener), 0))


def nested(opening: str, closing: str) -> Make:
    """``opening`` repeated, then as many ``closing``."""
    return lambda size: opening * (size // 2) + closing * (size - size // 2)


def mix(alphabet: str, seed: int) -> Make:
    """Characters of ``alphabet`` drawn at random (seeded)."""
    return lambda size: "".join(random.Random(seed).choices(alphabet, k=size))


def corpus(*, full: bool = True) -> dict[str, Make]:
    """Every hostile input, by a readable name; ``full=False``: a smaller set for screening."""
    inputs: dict[str, Make] = {}
    for char in string.printable:
        inputs[f"run {char!r}"] = run(char)
        if full and char not in "\n\r\x0b\x0c":
            inputs[f"lines {char!r}"] = run(char + "\n")
    inputs["run '\\r\\n'"] = run("\r\n")
    fillers = FILLERS if full else ("a", " ", "\n", "\\")
    for opener in OPENERS:
        inputs[f"run {opener!r}"] = run(opener)
        for filler in fillers:
            inputs[f"{opener!r} then {filler!r}"] = opened(opener, filler)
    for pair in PAIRS:
        inputs[f"run {pair!r}"] = run(pair)
    for opening, closing in ("()", "[]", "{}", "<>", ("/*", "*/"), ("(*", "*)"), ("${", "}"),
                             ("`${", "}`"), ("<a>", "</a>"), ('"(', ')"')):
        inputs[f"nested {opening}{closing}"] = nested(opening, closing)
    for name, alphabet in ALPHABETS.items():
        for seed in MIX_SEEDS if full else MIX_SEEDS[:1]:
            inputs[f"mix {name} {seed}"] = mix(alphabet, seed)
    return inputs


def typical() -> dict[str, Make]:
    """The inputs that most often make a lexer superlinear, by what they are: the scan of every
    lexer and the fuzz test of the listed ones try these (the corpus has many more)."""
    return {
        "blank lines": run("\n"),
        "blank lines of spaces": run(" \n"),
        "spaces": run(" "),
        "tabs": run("\t"),
        "backslashes": run("\\"),
        "line continuations": run("\\\n"),
        "nested brackets": nested("([{", "}])"),
        "nested template literals": nested("`${", "}`"),
        "unterminated string": opened('"', "a"),
        "unterminated string of words": opened('"', "a b "),
        "a quote then backslashes": opened('"', "\\"),
        "an apostrophe then backslashes": opened("'", "\\"),
        "escaped quotes": run('"\\'),
        "escaped apostrophes": run("'\\"),
        "unterminated comment": opened("/*", "a\n"),
        "unterminated heredoc": opened("<<EOF\n", "a\n"),
        "heredoc word": opened("<<", "a"),
        "heredoc openers": run("<<EOF\n"),
        "template literal openers": run("`${"),
        "an interpolation then blank lines": opened("${", "\n"),
        "a sigil then blank lines": opened("$", "\n"),
        "a decorator then blank lines": opened("@", "\n"),
        "a colon then blank lines": opened(":", " \n"),
        "dotted names": run("a."),
        "names and colons": run("a:"),
        "lines of a name": run("a\n"),
        "angle brackets": run("<>"),
        "double brackets": run("[["),
        "underscores": run("_"),
        "mixed quotes and escapes": mix(ALPHABETS["quotes"], 1),
        "mixed brackets": mix(ALPHABETS["brackets"], 1),
        "mixed words": mix(ALPHABETS["words"], 1),
        "mixed printable": mix(ALPHABETS["printable"], 1),
    }


# Ordinary code, as a model writes it, to compare with: by the lexer's class name.
ORDINARY = {
    "PythonLexer": '''def mean(values: list[float]) -> float:
    """The mean of ``values``; 0.0 for none."""
    if not values:
        return 0.0  # nothing to average
    return sum(values) / len(values)


print(f"{mean([1, 2, 3]):.2f}", {"a": 1, 'b': [2, 3]})
''',
    "JavascriptLexer": '''export async function load(url, { retries = 3 } = {}) {
  for (let i = 0; i < retries; i++) {
    const res = await fetch(`${url}?page=${i}`);  // one page at a time
    if (res.ok) return res.json();
  }
  throw new Error("gave up: " + url);
}
''',
    "TypeScriptLexer": '''interface User { id: number; name: string; tags?: string[] }

export function label(user: User): string {
  const tags = user.tags?.join(", ") ?? "none";
  return `${user.name} (#${user.id}): ${tags}`;
}
''',
    "JsonLexer": '''{"name": "demo", "version": "1.0.0", "private": true,
 "scripts": {"build": "tsc -p .", "test": "jest --ci"},
 "values": [1, 2.5, -3e4, null, false], "nested": {"a": {"b": "c"}}}
''',
    "BashLexer": '''#!/usr/bin/env bash
set -euo pipefail
for f in "$@"; do
  if [[ -f "$f" ]]; then
    echo "counting ${f}: $(wc -l < "$f") lines"  # one per file
  fi
done
cat <<EOF > out.txt
done at $(date)
EOF
''',
    "HtmlLexer": '''<!DOCTYPE html>
<html lang="en">
<head><title>Demo</title><style>body { margin: 0; color: #333; }</style></head>
<body>
  <p class="note">Hello, <a href="/x?a=1&amp;b=2">world</a>!</p>
  <script>document.querySelector(".note").addEventListener("click", () => alert(1));</script>
</body>
</html>
''',
    "XmlLexer": '''<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <!-- the build -->
  <dependency><groupId>org.example</groupId><version>1.2</version></dependency>
  <data><![CDATA[a < b]]></data>
</project>
''',
    "CssLexer": '''@media (max-width: 600px) {
  .card > h2, .card:hover::after {
    margin: 0 auto; color: rgb(10 20 30 / 50%);
    background: url("img/bg.png") no-repeat;  /* fallback */
  }
}
''',
    "SqlLexer": '''SELECT u.name, COUNT(o.id) AS orders
FROM users u LEFT JOIN orders o ON o.user_id = u.id
WHERE u.created_at > '2024-01-01' -- this year
GROUP BY u.name HAVING COUNT(o.id) > 2 ORDER BY orders DESC;
''',
    "JavaLexer": '''public final class Greeter {
    private static final String HELLO = "Hello, %s!";

    /** Greets {@code name}. */
    public String greet(String name) {
        return String.format(HELLO, name == null ? "world" : name);
    }
}
''',
    "KotlinLexer": '''data class User(val id: Int, val name: String)

fun main() {
    val users = listOf(User(1, "Ann"), User(2, "Bo"))
    users.filter { it.id > 1 }.forEach { println("${it.name}: ${it.id}") }
}
''',
    "CLexer": '''#include <stdio.h>

/* Sums the first n integers. */
static long sum(int n) {
    long total = 0;
    for (int i = 1; i <= n; i++) total += i;
    return total;
}

int main(void) { printf("%ld\\n", sum(10)); return 0; }
''',
    "CppLexer": '''#include <vector>
#include <string>

template <typename T>
T total(const std::vector<T>& xs) {
    T sum{};
    for (const auto& x : xs) sum += x;  // range-for
    return sum;
}
int main() { std::string s = "ok"; return total<int>({1, 2, 3}) == 6 ? 0 : 1; }
''',
    "CSharpLexer": '''using System.Linq;

public record User(int Id, string Name);

public static class Users {
    // The names, sorted.
    public static string[] Names(User[] users) =>
        users.Select(u => u.Name).OrderBy(n => n).ToArray();
    public static string Label(User u) => $"{u.Name} (#{u.Id})";
}
''',
    "GoLexer": '''package main

import "fmt"

// Sum adds the numbers.
func Sum(xs ...int) (total int) {
	for _, x := range xs {
		total += x
	}
	return
}

func main() { fmt.Printf("%d\\n", Sum(1, 2, 3)) }
''',
    "RustLexer": '''use std::collections::HashMap;

/// Counts each word.
fn count(text: &str) -> HashMap<&str, usize> {
    let mut counts = HashMap::new();
    for word in text.split_whitespace() {
        *counts.entry(word).or_insert(0) += 1;
    }
    counts
}

fn main() { println!("{:?}", count("a b a")); }
''',
    "RubyLexer": '''class Greeter
  attr_reader :name

  def initialize(name = "world")
    @name = name
  end

  # Says hello.
  def greet = puts("Hello, #{name}!")
end

%w[a b].each { |n| Greeter.new(n).greet }
''',
    "PhpLexer": '''<?php
declare(strict_types=1);

function greet(string $name): string {
    // A greeting.
    return sprintf("Hello, %s!", $name ?: 'world');
}
echo greet($_GET['name'] ?? ''), PHP_EOL;
''',
    "SwiftLexer": '''struct User: Codable {
    let id: Int
    var name: String
}

func label(_ user: User) -> String {
    // The label shown.
    return "\\(user.name) (#\\(user.id))"
}
print([User(id: 1, name: "Ann")].map(label))
''',
    "YamlLexer": '''version: "3.9"
services:
  web:
    image: nginx:1.25  # the server
    ports: ["8080:80"]
    environment:
      - DEBUG=false
    command: >
      sh -c "nginx -g 'daemon off;'"
''',
    "TOMLLexer": '''[project]
name = "demo"
version = "0.1.0"
dependencies = ["httpx>=0.27", 'rich']

[tool.ruff]
line-length = 100  # wide
exclude = { dirs = ["build"] }
''',
    "IniLexer": '''; settings
[server]
host = 127.0.0.1
port = 8080

[paths]
data = /var/lib/demo
''',
    "DiffLexer": '''diff --git a/app.py b/app.py
--- a/app.py
+++ b/app.py
@@ -1,4 +1,4 @@
 import os
-DEBUG = True
+DEBUG = False
 PORT = 8080
''',
    "DockerLexer": '''FROM python:3.12-slim AS base
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt \\
    && rm -rf /root/.cache
ENV PORT=8080
CMD ["python", "-m", "app"]
''',
    "LuaLexer": '''local M = {}

-- Sums the values of t.
function M.sum(t)
  local total = 0
  for _, v in ipairs(t) do total = total + v end
  return total
end

print(string.format("%d", M.sum({1, 2, 3})))
return M
''',
    "SLexer": '''library(dplyr)

# Mean by group.
summary <- df %>%
  group_by(group) %>%
  summarise(mean = mean(value, na.rm = TRUE), n = n())
print(summary[summary$n > 2, ])
''',
}

"""chatstream's translations are complete and current (docs/languages.md).

For each shipped language, the catalogue (``chatstream/locale/<lang>/LC_MESSAGES/django.po``):

- holds exactly the messages ``makemessages --no-location`` finds in the code and templates
  today (run into a copy of the package: a string added, changed or removed without
  ``make messages`` fails here);
- translates every one of them (no empty ``msgstr``, no ``fuzzy`` flag), keeping each
  placeholder of the English text (``%(name)s``);
- ships a ``.mo`` that is what ``msgfmt`` makes of the ``.po`` now, and that the wheel holds.

Both need GNU gettext (``msgfmt``, ``xgettext``): without it these tests skip, or fail where CI
requires the services (``CHATSTREAM_REQUIRE_SERVICES=1``), as PostgreSQL's and Redis's do.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "chatstream"
LOCALE = PACKAGE / "locale"
LANGUAGES = ("de", "fr", "es")
DJANGO_ADMIN = [sys.executable, "-m", "django"]


@dataclass
class Entry:
    """One message of a catalogue."""

    context: str | None
    msgid: str
    plural: str | None
    strs: list[str]
    flags: set[str] = field(default_factory=set)

    @property
    def key(self) -> tuple[str | None, str, str | None]:
        return (self.context, self.msgid, self.plural)


def _unquote(text: str) -> str:
    return str(ast.literal_eval(text))


def parse_po(text: str) -> list[Entry]:
    """The catalogue's entries, the header (msgid "") first, obsolete ones (#~) left out."""
    entries: list[Entry] = []
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = [line for line in block.splitlines() if not line.startswith("#~")]
        flags: set[str] = set()
        fields: dict[str, str] = {}
        current = ""
        for line in lines:
            if line.startswith("#,"):
                flags.update(flag.strip() for flag in line[2:].split(","))
            elif line.startswith("#") or not line.strip():
                continue
            elif line.startswith('"'):
                fields[current] += _unquote(line)
            else:
                current, _, quoted = line.partition(" ")
                fields[current] = _unquote(quoted)
        if "msgid" not in fields:
            continue
        strs = [fields[k] for k in sorted(fields, key=lambda k: int(k[7:-1]) if "[" in k else 0)
                if k.startswith("msgstr")]
        entries.append(Entry(fields.get("msgctxt"), fields["msgid"], fields.get("msgid_plural"),
                             strs, flags))
    return entries


def catalogue(language: str) -> list[Entry]:
    return parse_po((LOCALE / language / "LC_MESSAGES" / "django.po").read_text("utf-8"))


def nplurals(entries: list[Entry]) -> int:
    found = re.search(r"nplurals=(\d+)", entries[0].strs[0])
    assert found, "the catalogue's header has no Plural-Forms"
    return int(found.group(1))


PLACEHOLDER = re.compile(r"%\(\w+\)[sd]|%[sd]|\{\w+\}")


@pytest.fixture
def gettext_tools(require_service: Callable[[str, Callable[[], bool]], None]) -> None:
    """GNU gettext's msgfmt and xgettext: skipped without them, required in CI (CI=true, or
    CHATSTREAM_REQUIRE_SERVICES=1 as .ci/run sets)."""
    missing = [tool for tool in ("msgfmt", "xgettext") if not shutil.which(tool)]
    if missing and os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI must check the translations: {', '.join(missing)} missing "
                    "(Debian's gettext package: scripts/install-gettext.sh)")
    require_service("GNU gettext (msgfmt, xgettext: Debian's gettext package)",
                    lambda: all(shutil.which(tool) for tool in ("msgfmt", "xgettext")))


@pytest.fixture(scope="module")
def fresh_catalogues(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The catalogues as ``make messages`` would leave them: makemessages run in a copy of
    the package (with the committed catalogues, which it merges into)."""
    copy = tmp_path_factory.mktemp("messages") / "chatstream"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.mo"))
    if shutil.which("xgettext"):
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        subprocess.run([*DJANGO_ADMIN, "makemessages", *(f"-l{lang}" for lang in LANGUAGES),
                        "--no-location", "--no-obsolete"],
                       cwd=copy, env=env, check=True, capture_output=True)
    yield copy / "locale"


@pytest.mark.usefixtures("gettext_tools")
@pytest.mark.parametrize("language", LANGUAGES)
def test_catalogue_holds_the_messages_of_the_code(language: str, fresh_catalogues: Path) -> None:
    fresh = parse_po((fresh_catalogues / language / "LC_MESSAGES" / "django.po").read_text())
    committed = catalogue(language)
    wanted = {e.key for e in fresh[1:]}
    held = {e.key for e in committed[1:]}
    assert not wanted - held, f"{language}: not in the catalogue (run `make messages`)"
    assert not held - wanted, f"{language}: no longer in the code (run `make messages`)"
    # makemessages merges: a changed string comes back fuzzy, a translation unchanged.
    assert [(e.key, e.strs, "fuzzy" in e.flags) for e in fresh[1:]] == [
        (e.key, e.strs, "fuzzy" in e.flags) for e in committed[1:]]


@pytest.mark.parametrize("language", LANGUAGES)
def test_every_message_is_translated(language: str) -> None:
    entries = catalogue(language)
    header = entries[0]
    assert header.msgid == "" and "fuzzy" not in header.flags
    assert re.search(rf"^Language: {language}$", header.strs[0], re.MULTILINE)
    forms = nplurals(entries)
    problems = []
    for entry in entries[1:]:
        name = f"{entry.context + ' | ' if entry.context else ''}{entry.msgid!r}"
        if "fuzzy" in entry.flags:
            problems.append(f"fuzzy: {name}")
        if entry.plural is not None and len(entry.strs) != forms:
            problems.append(f"{len(entry.strs)} forms, not {forms}: {name}")
        if not entry.strs or not all(s.strip() for s in entry.strs):
            problems.append(f"untranslated: {name}")
            continue
        english = sorted(PLACEHOLDER.findall(entry.msgid + (entry.plural or "")))
        for translated in entry.strs:
            if sorted(set(PLACEHOLDER.findall(translated))) != sorted(set(english)):
                problems.append(f"placeholders differ: {name} -> {translated!r}")
    assert not problems, f"{language}:\n" + "\n".join(problems)


@pytest.mark.usefixtures("gettext_tools")
@pytest.mark.parametrize("language", LANGUAGES)
def test_compiled_catalogue_is_current(language: str, tmp_path: Path) -> None:
    folder = LOCALE / language / "LC_MESSAGES"
    shipped = folder / "django.mo"
    assert shipped.exists(), f"{shipped} is missing (run `make messages`)"
    made = tmp_path / "django.mo"
    subprocess.run(["msgfmt", "--check-format", "-o", str(made), str(folder / "django.po")],
                   check=True, capture_output=True)
    assert made.read_bytes() == shipped.read_bytes(), (
        f"{shipped} is not the compiled {language} catalogue (run `make messages`)")


def test_the_wheel_ships_every_compiled_catalogue(tmp_path: Path) -> None:
    # Built from a copy: setuptools writes build/ and *.egg-info where it builds.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(PACKAGE, source / "chatstream", ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path),
         str(source)], capture_output=True, text=True, env={**os.environ, "PIP_NO_INPUT": "1"})
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("chatstream-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    pos = sorted(LOCALE.glob("*/LC_MESSAGES/django.po"))
    assert {p.parent.parent.name for p in pos} >= set(LANGUAGES)
    for po in pos:
        relative = po.relative_to(ROOT).with_suffix(".mo").as_posix()
        assert relative in names, f"the wheel has no {relative}"


TRANSLATING = {"_", "gettext", "gettext_lazy", "ngettext", "ngettext_lazy", "pgettext",
               "pgettext_lazy", "npgettext", "npgettext_lazy"}


def test_no_message_is_marked_inside_an_f_string() -> None:
    # xgettext does not look inside f-strings: a message marked there is never extracted, so
    # it stays English in every language while the catalogues look complete.
    hidden = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.JoinedStr):
                hidden += [f"{path.relative_to(ROOT)}:{call.lineno}"
                           for part in node.values if isinstance(part, ast.FormattedValue)
                           for call in ast.walk(part.value) if isinstance(call, ast.Call)
                           and isinstance(call.func, ast.Name) and call.func.id in TRANSLATING]
    assert not hidden, f"messages marked inside f-strings (mark them outside): {hidden}"

"""The README's settings table says what ``chatstream.conf.SPEC`` declares, row for row."""

from __future__ import annotations

import re
from pathlib import Path

from chatstream.conf import SPEC

README = Path(__file__).resolve().parent.parent / "README.md"
ROW = re.compile(r"\| `CHATSTREAM_(?P<name>\w+)` \| (?P<default>.+?) \| (?P<what>.+) \|")


def settings_table() -> dict[str, tuple[str, str]]:
    """The README's settings table: each setting's default column and description."""
    section = README.read_text(encoding="utf-8").split("\n## Settings\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    rows = (ROW.fullmatch(line) for line in section.splitlines())
    return {row["name"]: (row["default"], row["what"]) for row in rows if row}


def test_table_names_every_setting_in_order():
    assert list(settings_table()) == list(SPEC)


def test_table_shows_each_default():
    defaults = {name: default for name, (default, _) in settings_table().items()}
    assert defaults == {name: setting.default_text for name, setting in SPEC.items()}


def test_table_shows_each_description():
    descriptions = {name: what for name, (_, what) in settings_table().items()}
    assert descriptions == {name: setting.what for name, setting in SPEC.items()}

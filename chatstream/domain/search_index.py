"""The index behind conversation search, one per kind of database, and what keeps it whole.

What is indexed is what a user may find: the text of user and assistant messages (every
version of an edited message) and the conversations' titles; never a system or tool message.
A conversation's rows go with it.

- **PostgreSQL**: two GIN indexes on expressions, ``to_tsvector(<config>, <content>)`` of the
  messages (partial: user and assistant messages only) and ``to_tsvector(<config>, <title>)``
  of the conversations, with the text search configuration ``CHATSTREAM_SEARCH_CONFIG`` named
  when they are made, and the text as ``searched_text`` has it (below). Expression indexes
  rather than a stored ``tsvector`` column: no column (and no table rewrite) is added to the
  messages, the models stay the same on every database, and the database keeps them in step by
  itself. A search written with the same expression uses them; with another configuration it
  still works, without them (a system check says so, and ``chatstream_rebuild_search`` makes
  them again).
- **SQLite**: two FTS5 tables kept in step by triggers. The messages' is an *external content*
  table over ``chatstream_message`` (its rowid is the message's integer key): it holds the
  index only, not a second copy of every message, and ``snippet()`` reads the text from the
  message row. Titles have a small table of their own, holding the title and the
  conversation's key (a UUID: not a rowid, so no external content), which its triggers find
  by matching the key's column. Django's SQLite schema editor rebuilds a table on most field
  changes and drops its triggers: a system check finds them missing, and
  ``chatstream_rebuild_search`` makes them again and rebuilds the tables.
- Other databases: no index (``domain/search.py`` matches every word with a plain
  case-insensitive containment).
"""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import ProgrammingError, transaction

from ..conf import conf
from ..models import Conversation, Message

MESSAGES = Message._meta.db_table
CONVERSATIONS = Conversation._meta.db_table
# The roles whose messages are searched: what the user wrote and what the model answered.
SEARCHED_ROLES = (Message.Role.USER.value, Message.Role.ASSISTANT.value)
ROLES_SQL = ", ".join(f"'{role}'" for role in SEARCHED_ROLES)

# PostgreSQL's indexes.
MESSAGE_INDEX = "chatstream_message_search"
TITLE_INDEX = "chatstream_conv_title_search"

# SQLite's tables and triggers.
MESSAGE_FTS = "chatstream_message_fts"
TITLE_FTS = "chatstream_title_fts"
TOKENIZER = "unicode61 remove_diacritics 2"

# PostgreSQL's parser reads some text as one token, or as none, where FTS5's unicode61 reads
# words: "<div>" and "List<String>" as tags (left out), "bob@example.com" as an email,
# "docs.djangoproject.com/en/" as a host and a path, "3.14" as a number, "&amp;" as an entity.
# The characters that make those are control characters in the text indexed, searched and
# shown in a snippet: blanks to the parser in every locale (the words either side are words,
# as FTS5 reads them), not spaces to websearch_to_tsquery (a query's "bob@example.com" is the
# phrase of its words, as FTS5 reads it), and one per character (a snippet's are put back).
# Nested replace() rather than translate(): both immutable, but PostgreSQL's translate() costs
# about seven times as much per character (it reads every character against the list), which
# added half again to parsing a message; eight replace() calls add under a tenth.
SEPARATORS = "<>@/.:&+"
_BLANKS = "".join(chr(1 + i) for i in range(len(SEPARATORS)))
_SEPARATORS_BACK = str.maketrans(_BLANKS, SEPARATORS)

_CONFIG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")


def config() -> str:
    """``CHATSTREAM_SEARCH_CONFIG`` as the SQL literal of a ``regconfig``: written into the
    statements (not a parameter), so that a search's expression is the index's own."""
    name = conf.SEARCH_CONFIG
    if not isinstance(name, str) or not _CONFIG_NAME.fullmatch(name):
        raise ImproperlyConfigured(
            f"CHATSTREAM_SEARCH_CONFIG must name a text search configuration, not {name!r}.")
    return f"'{name}'::regconfig"


def searched_text(sql: str) -> str:
    """The SQL expression of the text ``sql`` (a column, a parameter) as PostgreSQL's search
    reads it, in its index, its queries and its snippets alike: ``SEPARATORS`` made blanks."""
    for separator, blank in zip(SEPARATORS, _BLANKS, strict=True):
        sql = f"replace({sql}, '{separator}', E'\\{ord(blank):03o}')"
    return sql


def shown_text(text: str) -> str:
    """A snippet of ``searched_text`` with its ``SEPARATORS`` back (a control character the
    text itself held among them is shown as one of those: never markup, it is escaped)."""
    return text.translate(_SEPARATORS_BACK)


def message_vector(table: str = "m") -> str:
    """The expression of a message's ``tsvector``, as its index has it."""
    return f"to_tsvector({config()}, {searched_text(f'{table}.content')})"


def title_vector(table: str = "c") -> str:
    """The expression of a conversation title's ``tsvector``, as its index has it."""
    return f"to_tsvector({config()}, {searched_text(f'{table}.title')})"


def query(sql: str) -> str:
    """The expression of the ``tsquery`` of a user's query ``sql`` (a parameter)."""
    return f"websearch_to_tsquery({config()}, {searched_text(sql)})"


def _postgres_create() -> list[str]:
    cfg = config()
    return [
        f"CREATE INDEX IF NOT EXISTS {MESSAGE_INDEX} ON {MESSAGES} USING gin "
        f"((to_tsvector({cfg}, {searched_text('content')}))) WHERE role IN ({ROLES_SQL})",
        f"CREATE INDEX IF NOT EXISTS {TITLE_INDEX} ON {CONVERSATIONS} USING gin "
        f"((to_tsvector({cfg}, {searched_text('title')})))",
    ]


def _postgres_expression(column: str) -> re.Pattern[str]:
    """An index's expression as PostgreSQL writes it back (``pg_indexes.indexdef``; a
    ``varchar`` column is cast to text)."""
    name = config().split("'")[1]
    return re.compile(
        re.escape(f"to_tsvector('{name}'::regconfig, " + "replace(" * len(SEPARATORS))
        + f"(?:{column}|\\({column}\\)::text)"
        + re.escape("".join(f", '{separator}'::text, '{blank}'::text)"
                            for separator, blank in zip(SEPARATORS, _BLANKS, strict=True)))
        + re.escape(")"))


_POSTGRES_DROP = [f"DROP INDEX IF EXISTS {MESSAGE_INDEX}", f"DROP INDEX IF EXISTS {TITLE_INDEX}"]

_SQLITE_TABLES = [
    f"CREATE VIRTUAL TABLE IF NOT EXISTS {MESSAGE_FTS} USING fts5(content, "
    f"content='{MESSAGES}', content_rowid='id', tokenize='{TOKENIZER}')",
    f"CREATE VIRTUAL TABLE IF NOT EXISTS {TITLE_FTS} USING fts5(title, conversation, "
    f"tokenize='{TOKENIZER}')",
]

_INDEXED = f"role IN ({ROLES_SQL})"
_ADD_MESSAGE = f"INSERT INTO {MESSAGE_FTS}(rowid, content) SELECT new.id, new.content"
# An external content table is told the text it indexed, to take it out.
_REMOVE_MESSAGE = (f"INSERT INTO {MESSAGE_FTS}({MESSAGE_FTS}, rowid, content) "
                   "SELECT 'delete', old.id, old.content")
_ADD_TITLE = f"INSERT INTO {TITLE_FTS}(title, conversation) VALUES (new.title, new.id)"
_REMOVE_TITLE = (f"DELETE FROM {TITLE_FTS} WHERE {TITLE_FTS} MATCH "
                 "'conversation : \"' || old.id || '\"'")

SQLITE_TRIGGERS = {
    "chatstream_message_fts_insert":
        f"AFTER INSERT ON {MESSAGES} BEGIN {_ADD_MESSAGE} WHERE new.{_INDEXED}; END",
    "chatstream_message_fts_delete":
        f"AFTER DELETE ON {MESSAGES} BEGIN {_REMOVE_MESSAGE} WHERE old.{_INDEXED}; END",
    "chatstream_message_fts_update":
        f"AFTER UPDATE OF content, role ON {MESSAGES} BEGIN "
        f"{_REMOVE_MESSAGE} WHERE old.{_INDEXED}; {_ADD_MESSAGE} WHERE new.{_INDEXED}; END",
    "chatstream_title_fts_insert": f"AFTER INSERT ON {CONVERSATIONS} BEGIN {_ADD_TITLE}; END",
    "chatstream_title_fts_delete": f"AFTER DELETE ON {CONVERSATIONS} BEGIN {_REMOVE_TITLE}; END",
    "chatstream_title_fts_update":
        f"AFTER UPDATE OF title ON {CONVERSATIONS} BEGIN {_REMOVE_TITLE}; {_ADD_TITLE}; END",
}

_SQLITE_REFILL = [
    f"INSERT INTO {MESSAGE_FTS}({MESSAGE_FTS}) VALUES ('delete-all')",
    f"INSERT INTO {MESSAGE_FTS}(rowid, content) SELECT id, content FROM {MESSAGES} "
    f"WHERE {_INDEXED}",
    f"DELETE FROM {TITLE_FTS}",
    f"INSERT INTO {TITLE_FTS}(title, conversation) SELECT title, id FROM {CONVERSATIONS}",
]


def install(schema_editor: Any) -> None:
    """Make the index on the schema editor's database (a migration's forward step)."""
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        for statement in _postgres_create():
            schema_editor.execute(statement)
    elif vendor == "sqlite":
        for statement in _SQLITE_TABLES:
            schema_editor.execute(statement)
        _sqlite_triggers(schema_editor)
        for statement in _SQLITE_REFILL:
            schema_editor.execute(statement)


def uninstall(schema_editor: Any) -> None:
    """Remove the index (a migration's backward step)."""
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        for statement in _POSTGRES_DROP:
            schema_editor.execute(statement)
    elif vendor == "sqlite":
        for name in SQLITE_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")
        for table in (MESSAGE_FTS, TITLE_FTS):
            schema_editor.execute(f"DROP TABLE IF EXISTS {table}")


def _sqlite_triggers(schema_editor: Any) -> None:
    for name, body in SQLITE_TRIGGERS.items():
        schema_editor.execute(f"CREATE TRIGGER IF NOT EXISTS {name} {body}")


def rebuild(schema_editor: Any) -> None:
    """Make the index again from the rows: on SQLite, the tables and triggers made where they
    are missing and the tables refilled; on PostgreSQL, the indexes made again with the
    configuration in force. Nothing elsewhere."""
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        for statement in _POSTGRES_DROP:
            schema_editor.execute(statement)
    install(schema_editor)


def config_exists(connection: Any) -> bool:
    """Whether the PostgreSQL database behind ``connection`` has the configuration named."""
    try:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(f"SELECT {config()}")
    except ProgrammingError:  # undefined_object
        return False
    return True


def missing(connection: Any) -> list[str]:
    """What the index of ``connection``'s database lacks: the names of its tables, triggers or
    indexes that are not there, or whose definition is not the current one."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'trigger')")
            present = {name for (name,) in cursor.fetchall()}
            return [name for name in [MESSAGE_FTS, TITLE_FTS, *SQLITE_TRIGGERS]
                    if name not in present]
        if connection.vendor == "postgresql":
            cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE indexname IN (%s, %s)",
                           [MESSAGE_INDEX, TITLE_INDEX])
            made = dict(cursor.fetchall())
            return [index for index, column in ((MESSAGE_INDEX, "content"),
                                                (TITLE_INDEX, "title"))
                    if not _postgres_expression(column).search(made.get(index, ""))]
    return []

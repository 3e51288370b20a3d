"""Search over a user's own conversations: their titles and the text of their messages.

``search(user, q)`` returns the user's conversations that match, each with the best match of
its own (a message, or the title) and a snippet of it with the hits marked; one function per
kind of database (the indexes: ``search_index.py``):

- **PostgreSQL**: full-text search, ``websearch_to_tsquery`` (quoted phrases, ``-word``,
  ``or``) in ``CHATSTREAM_SEARCH_CONFIG``, ranked by ``ts_rank``, the snippet by
  ``ts_headline``; best first. Index, query and snippet read the text through
  ``search_index.searched_text``, so that the words of ``<div>``, an email or a URL are words.
- **SQLite**: FTS5, the query written out from the user's (below), ranked by ``bm25()``, the
  snippet by ``snippet()``; best first.
  Both rank only the user's newest ``CANDIDATES`` matching messages (and the matching
  titles): ranking every match of a common word cost more than the rest of the search.
- **Elsewhere**: every word contained in the title or in one message (case-insensitive), newest
  first, the snippet made here.

A user's query is read once, here, the way web search reads it (``Terms``): quoted phrases,
``-word`` left out, ``or`` between alternatives, every other word a word to find. FTS5 gets each
of them quoted, so that nothing a user types (``AND``, ``*``, ``:``, ``NEAR(``, a lone quote) is
FTS5 syntax. A query with no word to find (only ``-word``, or only punctuation) finds nothing.

The database's snippet functions do not escape HTML: they are given hit markers no text holds
(private-use characters around a random nonce), the snippet is escaped whole, and only then
are the markers turned into ``<mark>``. An older version of an edited message is searched too:
it is the user's text, and its page still shows it with its replies.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, router
from django.db.models import Exists, OuterRef, Q, Subquery
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from ..models import Conversation, Message
from . import search_index
from .search_index import MESSAGE_FTS, SEARCHED_ROLES, TITLE_FTS

MAX_QUERY_LENGTH = 200
# Conversations one search returns at most: the best ones (a page of results, no pagination).
RESULTS = 20
# A title match counts this much more than a message's.
TITLE_WEIGHT = 2.0
# Matching messages ranked at most, the user's newest: a common word matches thousands of a
# user's messages, and ranking them all costs more than the search (docs/search.md, "Cost").
CANDIDATES = 200
SNIPPET_WORDS = 24
_SNIPPET_CHARS = 160


@dataclass
class Terms:
    """A query as web search reads it: alternatives (``or``) of words and phrases that must
    all be found, and the words or phrases that must not be."""

    alternatives: list[list[str]] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, q: str) -> Terms:
        terms = cls(alternatives=[[]])
        for match in re.finditer(r'(-?)("([^"]*)"?|[^\s"]+)', q):
            negated, token, phrase = match.group(1), match.group(2), match.group(3)
            text = (phrase if phrase is not None else token).strip()
            if phrase is None and text.lower() == "or" and not negated:
                terms.alternatives.append([])
            elif any(ch.isalnum() for ch in text):  # the tokenizers see no word in the rest
                (terms.excluded if negated else terms.alternatives[-1]).append(text)
        terms.alternatives = [words for words in terms.alternatives if words]
        return terms

    @property
    def words(self) -> list[str]:
        """Every word and phrase to find, each once."""
        return list(dict.fromkeys(w for words in self.alternatives for w in words))

    def loose(self) -> str | None:
        """The query without its phrases (their words, each to be found) and exclusions, for
        the index to find a superset of the matches; None when that is the query itself."""
        if not self.excluded and not any(any(ch.isspace() for ch in w) for w in self.words):
            return None
        return " or ".join(" ".join(word.lstrip("-") for phrase in words for word in phrase.split()
                                    if word.lower() != "or")
                           for words in self.alternatives)

    def fts5(self) -> str:
        """The FTS5 query: every word or phrase a quoted string, joined by FTS5's operators."""
        def quoted(text: str) -> str:
            return '"' + text.replace('"', '""') + '"'

        found = " OR ".join("(" + " AND ".join(map(quoted, words)) + ")"
                            for words in self.alternatives)
        if self.excluded:
            return f"({found}) NOT ({' OR '.join(map(quoted, self.excluded))})"
        return f"({found})"


@dataclass
class Hit:
    """A conversation that matches: the message (None: the title) whose snippet is shown."""

    conversation: Conversation
    message_id: int | None
    snippet: SafeString
    rank: float


@dataclass(frozen=True)
class _Markers:
    """Hit markers for a database's snippet function: private-use characters and a nonce."""

    start: str
    stop: str

    @classmethod
    def new(cls) -> _Markers:
        nonce = secrets.token_hex(8)
        return cls(f"\ue000{nonce}\ue001", f"\ue002{nonce}\ue003")

    def html(self, raw: str) -> SafeString:
        """``raw`` escaped, its marked hits in ``<mark>``."""
        parts: list[str] = [escape(piece) for piece in raw.split(self.start)[:1]]
        for piece in raw.split(self.start)[1:]:
            hit, found, rest = piece.partition(self.stop)
            parts.append(f"<mark>{escape(hit)}</mark>{escape(rest)}" if found else escape(piece))
        return mark_safe("".join(parts))  # every piece escaped above


# (conversation id, message id or None, rank, snippet's HTML), best first.
_Row = tuple[Any, int | None, float, SafeString]


def search(user: Any, q: str, *, limit: int = RESULTS, using: str | None = None,
           generic: bool = False) -> list[Hit]:
    """``user``'s conversations matching ``q``, best first (newest first without a full-text
    index), at most ``limit``. ``using``: the database (by default the user's own, else the
    messages'); ``generic``: the plain containment search whatever the database."""
    terms = Terms.parse(q[:MAX_QUERY_LENGTH])
    if not terms.alternatives:
        return []
    db = using or user._state.db or router.db_for_read(Message)
    vendor = "generic" if generic else connections[db].vendor
    finder: Callable[..., list[_Row]] = BACKENDS.get(vendor, _generic)
    rows = finder(db, user.pk, q[:MAX_QUERY_LENGTH], terms, limit)
    key = Conversation._meta.pk.to_python
    conversations = Conversation.objects.using(db).in_bulk([key(row[0]) for row in rows])
    return [Hit(conversations[key(c)], message, snippet, rank)
            for c, message, rank, snippet in rows if key(c) in conversations]


def _postgres(db: str, user_id: Any, q: str, terms: Terms, limit: int) -> list[_Row]:
    """Full-text search on PostgreSQL, over the expression indexes. The index finds the user's
    messages holding the words (``found``: their conversations' keys are a list the planner
    intersects with the index, so another user's matches are never read); phrases and
    exclusions are then checked on those; the newest ``CANDIDATES`` are ranked (``ts_rank``
    parses each message again: the index holds no vector), and the kept ones' snippets made."""
    markers = _Markers.new()
    query = search_index.query("%(q)s")
    loose = terms.loose()
    exact = (f"AND {search_index.message_vector('m')} @@ {query}" if loose is not None else "")
    sql = f"""
        WITH found AS MATERIALIZED (
            SELECT m.id, m.conversation_id, m.content FROM {search_index.MESSAGES} m
            WHERE m.conversation_id = ANY(ARRAY(
                    SELECT id FROM {search_index.CONVERSATIONS} WHERE user_id = %(user)s))
              AND m.role IN ({search_index.ROLES_SQL})
              AND {search_index.message_vector("m")} @@ {search_index.query("%(loose)s")}
        ), newest AS (
            SELECT m.* FROM (SELECT * FROM found ORDER BY id DESC OFFSET 0) m
            WHERE TRUE {exact} LIMIT %(candidates)s
        ), hits AS (
            SELECT m.conversation_id, m.id AS message_id,
                   ts_rank({search_index.message_vector("m")}, {query}) AS rank
            FROM newest m
            UNION ALL
            SELECT c.id, NULL, %(title_weight)s * ts_rank({search_index.title_vector("c")},
                                                           {query})
            FROM {search_index.CONVERSATIONS} c
            WHERE c.user_id = %(user)s AND {search_index.title_vector("c")} @@ {query}
        ), best AS (
            SELECT DISTINCT ON (conversation_id) conversation_id, message_id, rank FROM hits
            ORDER BY conversation_id, rank DESC, message_id DESC NULLS LAST
        ), top AS (
            SELECT best.*, c.updated_at FROM best
            JOIN {search_index.CONVERSATIONS} c ON c.id = best.conversation_id
            ORDER BY best.rank DESC, c.updated_at DESC LIMIT %(limit)s
        )
        SELECT top.conversation_id, top.message_id, top.rank,
               ts_headline({search_index.config()},
                           {search_index.searched_text("COALESCE(m.content, c.title)")},
                           {query}, %(options)s)
        FROM top JOIN {search_index.CONVERSATIONS} c ON c.id = top.conversation_id
        LEFT JOIN {search_index.MESSAGES} m ON m.id = top.message_id
        ORDER BY top.rank DESC, top.updated_at DESC"""
    options = (f'StartSel="{markers.start}", StopSel="{markers.stop}", MaxWords={SNIPPET_WORDS}, '
               f'MinWords={SNIPPET_WORDS // 3}, MaxFragments=2, FragmentDelimiter=" … "')
    with connections[db].cursor() as cursor:
        cursor.execute(sql, {"q": q, "loose": q if loose is None else loose, "user": user_id,
                             "limit": limit, "candidates": CANDIDATES,
                             "title_weight": TITLE_WEIGHT, "options": options})
        return [(c, m, rank, markers.html(search_index.shown_text(headline or "")))
                for c, m, rank, headline in cursor.fetchall()]


def _sqlite(db: str, user_id: Any, q: str, terms: Terms, limit: int) -> list[_Row]:
    """FTS5 on SQLite: the user's newest ``CANDIDATES`` matching messages (FTS5 reads its
    matches newest first and stops there; the user's message keys are a list it checks each
    against) and matching titles, the best match of each conversation (bm25 is lower for
    better), then the snippets of those kept."""
    match = terms.fts5()
    user = Conversation._meta.get_field("user").get_db_prep_value(
        user_id, connections[db])
    sql = f"""
        SELECT conversation_id, message_id, MIN(score) FROM (
            SELECT m.conversation_id AS conversation_id, m.id AS message_id,
                   found.score
            FROM (SELECT rowid AS id, bm25({MESSAGE_FTS}) AS score FROM {MESSAGE_FTS}
                  WHERE {MESSAGE_FTS} MATCH %s AND rowid + 0 IN (
                      SELECT m.id FROM {search_index.MESSAGES} m
                      JOIN {search_index.CONVERSATIONS} c ON c.id = m.conversation_id
                      WHERE c.user_id = %s)
                  ORDER BY rowid DESC LIMIT %s) AS found
            JOIN {search_index.MESSAGES} m ON m.id = found.id
            UNION ALL
            SELECT c.id, NULL, %s * bm25({TITLE_FTS}, 1.0, 0.0)
            FROM {TITLE_FTS} JOIN {search_index.CONVERSATIONS} c ON c.id = {TITLE_FTS}.conversation
            WHERE {TITLE_FTS} MATCH %s AND c.user_id = %s
        ) AS hits JOIN {search_index.CONVERSATIONS} c ON c.id = hits.conversation_id
        GROUP BY conversation_id
        ORDER BY MIN(score), MAX(c.updated_at) DESC LIMIT %s"""
    with connections[db].cursor() as cursor:
        cursor.execute(sql, [match, user, CANDIDATES, TITLE_WEIGHT, f"title : {match}", user,
                             limit])
        best = cursor.fetchall()
        snippets = _sqlite_snippets(cursor, match, best)
    return [(c, m, -score, snippets.get((c, m), mark_safe(""))) for c, m, score in best]


def _sqlite_snippets(cursor: Any, match: str, best: list[tuple[Any, int | None, float]]
                     ) -> dict[tuple[Any, int | None], SafeString]:
    """``snippet()`` of each kept match (it needs the MATCH of its own query)."""
    markers = _Markers.new()
    found: dict[tuple[Any, int | None], SafeString] = {}
    messages = {m: c for c, m, _score in best if m is not None}
    titles = [c for c, m, _score in best if m is None]
    args = [markers.start, markers.stop, "…", SNIPPET_WORDS]
    if messages:
        cursor.execute(
            f"SELECT rowid, snippet({MESSAGE_FTS}, 0, %s, %s, %s, %s) FROM {MESSAGE_FTS} "
            f"WHERE {MESSAGE_FTS} MATCH %s AND rowid IN ({', '.join(['%s'] * len(messages))})",
            [*args, match, *messages])
        found.update(((messages[m], m), markers.html(text)) for m, text in cursor.fetchall())
    if titles:
        cursor.execute(
            f"SELECT conversation, snippet({TITLE_FTS}, 0, %s, %s, %s, %s) FROM {TITLE_FTS} "
            f"WHERE {TITLE_FTS} MATCH %s AND conversation IN ({', '.join(['%s'] * len(titles))})",
            [*args, f"title : {match}", *titles])
        found.update(((c, None), markers.html(text)) for c, text in cursor.fetchall())
    return found


def _containing(name: str, terms: Terms) -> Q:
    """Rows whose ``name`` contains every word of one alternative, and none excluded."""
    matches = Q()
    for words in terms.alternatives:
        every = Q()
        for word in words:
            every &= Q(**{f"{name}__icontains": word})
        matches |= every
    for word in terms.excluded:
        matches &= ~Q(**{f"{name}__icontains": word})
    return matches


def _generic(db: str, user_id: Any, q: str, terms: Terms, limit: int) -> list[_Row]:
    """Any database: every word of an alternative contained in the title or in one message,
    newest conversation first; the newest matching message is the one shown."""
    messages = Message.objects.using(db).filter(_containing("content", terms),
                                                role__in=SEARCHED_ROLES)
    newest = messages.filter(conversation=OuterRef("pk")).order_by("-created_at", "-id")
    found = (Conversation.objects.using(db).filter(user_id=user_id)
             .annotate(in_title=Exists(Conversation.objects.using(db).filter(
                 _containing("title", terms), pk=OuterRef("pk"))),
                 message=Subquery(newest.values("pk")[:1]))
             .filter(Q(in_title=True) | Q(message__isnull=False))
             .order_by("-updated_at", "-pk").values_list("pk", "message", "title")[:limit])
    rows = list(found)
    texts = dict(Message.objects.using(db).filter(pk__in=[m for _c, m, _t in rows if m])
                 .values_list("pk", "content"))
    return [(c, m, 0.0, marked(texts[m] if m else title, terms.words)) for c, m, title in rows]


def marked(text: str, words: Iterable[str]) -> SafeString:
    """A snippet of ``text`` around the first of ``words`` found (case-insensitive), escaped,
    with every one of them in it marked."""
    ordered = sorted({w for w in words if w}, key=len, reverse=True)
    if not ordered:
        return mark_safe("")
    pattern = re.compile("|".join(map(re.escape, ordered)), re.IGNORECASE)
    first = pattern.search(text)
    start = max(0, (first.start() if first else 0) - _SNIPPET_CHARS // 3)
    window = text[start:start + _SNIPPET_CHARS]
    parts, at = ["…" if start else ""], 0
    for hit in pattern.finditer(window):
        parts += [escape(window[at:hit.start()]), f"<mark>{escape(hit.group())}</mark>"]
        at = hit.end()
    parts += [escape(window[at:]), "…" if start + _SNIPPET_CHARS < len(text) else ""]
    return mark_safe("".join(parts))  # every piece of the text escaped above


BACKENDS: dict[str, Callable[..., list[_Row]]] = {"postgresql": _postgres, "sqlite": _sqlite}

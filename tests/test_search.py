"""Conversation search (chatstream/domain/search.py, search_index.py, the list page's box): on
SQLite (FTS5) and PostgreSQL (full-text search), and the plain search of other databases."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connections
from django.test import Client
from django.urls import reverse

from chatstream.domain import search, search_index
from chatstream.models import Conversation, Generation, Message

from .workers import postgres_available

DATABASES = ["default", "postgres"] if postgres_available() else ["default"]
pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)
URL = "/chat/search/"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def alias(request, require_service) -> str:
    if request.param == "postgres":
        require_service("PostgreSQL (CHATSTREAM_TEST_POSTGRES)", postgres_available)
        return "postgres"
    return "default"


def user_in(alias: str, username: str = "alice") -> Any:
    return get_user_model().objects.db_manager(alias).create_user(username, password="pw")


def conversation(user: Any, *texts: str, title: str = "", role: str = "user") -> Conversation:
    """A conversation of ``user``'s in its database, holding ``texts`` as messages."""
    db = user._state.db
    made = Conversation.objects.using(db).create(user=user, title=title)
    for text in texts:
        Message.objects.using(db).create(conversation=made, role=role, content=text)
    return made


def found(user: Any, q: str, **kwargs: Any) -> list[Any]:
    return [hit.conversation.pk for hit in search.search(user, q, **kwargs)]


def test_words_phrases_exclusions_and_alternatives(alias):
    alice = user_in(alias)
    fox = conversation(alice, "The quick brown fox jumps")
    dog = conversation(alice, "A brown dog, quick as anything")
    cat = conversation(alice, "A lazy cat sleeps")
    assert set(found(alice, "quick brown")) == {fox.pk, dog.pk}
    assert found(alice, '"quick brown"') == [fox.pk]
    assert found(alice, "quick -fox") == [dog.pk]
    assert found(alice, 'brown -"brown fox"') == [dog.pk]
    assert set(found(alice, "fox or cat")) == {fox.pk, cat.pk}
    assert found(alice, "QUICK Fox") == [fox.pk]
    assert found(alice, "elephant") == []
    assert found(alice, "-fox") == []  # nothing to find: no results, not every conversation


def test_the_best_match_comes_first_and_a_title_counts(alias):
    alice = user_in(alias)
    once = conversation(alice, "kettle and more words about other things entirely")
    often = conversation(alice, "kettle kettle kettle")
    titled = conversation(alice, "nothing here", title="Kettle repairs")
    assert found(alice, "kettle") == [titled.pk, often.pk, once.pk]
    [hit] = [h for h in search.search(alice, "repairs")]
    assert hit.conversation.pk == titled.pk and hit.message_id is None
    assert "<mark>repairs</mark>" in hit.snippet.lower()


def test_the_snippet_marks_the_hits_and_escapes_the_text(alias):
    alice = user_in(alias)
    conversation(alice, 'Before <script>alert("x")</script> the needle & after')
    [hit] = search.search(alice, "needle")
    assert "<script>" not in hit.snippet and "&lt;script&gt;" in hit.snippet
    assert "<mark>needle</mark>" in hit.snippet and "&amp; after" in hit.snippet
    assert hit.snippet.count("<mark>") == 1


def test_marker_characters_in_the_text_never_become_markup(alias):
    alice = user_in(alias)
    forged = ("\ue000\ue001<b>bold</b>\ue002\ue003 "
              "\ue0000000000000000000\ue001 haystack \ue0020000000000000000\ue003 needle")
    conversation(alice, forged)
    [hit] = search.search(alice, "needle")
    assert "&lt;/b&gt;" in hit.snippet
    assert "<" not in hit.snippet.replace("<mark>", "").replace("</mark>", "")
    assert hit.snippet.count("<mark>") == hit.snippet.count("</mark>") == 1
    assert "<mark>needle</mark>" in hit.snippet


def test_never_another_users_conversation(alias):
    alice, mallory = user_in(alias), user_in(alias, "mallory")
    conversation(mallory, "secret plans", title="secret")
    mine = conversation(alice, "public plans")
    assert found(alice, "plans") == [mine.pk]
    assert found(alice, "secret") == []
    assert found(alice, "plans", generic=True) == [mine.pk]


def test_never_a_deleted_conversation_and_its_index_rows_go_with_it(alias):
    alice = user_in(alias)
    gone = conversation(alice, "ephemeral words", title="ephemeral title")
    conversation(alice, "lasting words")
    assert found(alice, "ephemeral") == [gone.pk]
    gone.delete()
    assert found(alice, "ephemeral") == []
    if alias == "default":  # the FTS5 rows themselves, not only the join, are gone
        with connections[alias].cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {search_index.MESSAGE_FTS} "
                           f"WHERE {search_index.MESSAGE_FTS} MATCH 'ephemeral'")
            assert cursor.fetchone() == (0,)
            cursor.execute(f"SELECT count(*) FROM {search_index.TITLE_FTS}")
            assert cursor.fetchone() == (1,)


def test_only_user_and_assistant_text_is_searched(alias):
    alice = user_in(alias)
    conversation(alice, "system instructions", role="system")
    conversation(alice, "tool output", role="tool")
    replied = conversation(alice, "a question")
    Message.objects.using(alias).create(conversation=replied, role="assistant",
                                        content="an answer")
    assert found(alice, "instructions") == [] and found(alice, "output") == []
    assert found(alice, "answer") == [replied.pk]


def test_a_changed_message_and_a_renamed_title_are_found_by_their_new_words(alias):
    alice = user_in(alias)
    talk = conversation(alice, "draft words", title="old name")
    message = talk.messages.get()
    message.content = "final words"
    message.save()
    talk.title = "new name"
    talk.save()
    assert found(alice, "draft") == [] and found(alice, "final") == [talk.pk]
    assert found(alice, "old") == [] and found(alice, "new") == [talk.pk]


def test_an_earlier_version_of_an_edited_message_is_found_and_links_to_its_page(alias):
    alice = user_in(alias)
    talk = conversation(alice, "original wording")
    first = talk.messages.get()
    Message.objects.using(alias).create(conversation=talk, role="user",
                                        content="edited wording", edit_of=first)
    [hit] = search.search(alice, "original")
    assert hit.message_id == first.pk
    if alias == "default":  # the page's links (the views read the default database)
        client = Client()
        client.force_login(alice)
        page = client.get(URL, {"q": "original"}).content.decode()
        assert reverse("chatstream:message-version", args=[first.pk]) in page



def test_phrases_and_exclusions_reach_past_the_ranked_candidates(alias):
    """Only the newest CANDIDATES matching messages are ranked (and found), but a phrase or
    an exclusion is checked on every message holding the words: an older match is found."""
    alice = user_in(alias)
    old = conversation(alice, "the kettle boils over")
    recent = conversation(alice)
    Message.objects.using(alias).bulk_create(
        Message(conversation=recent, role="user", content="boils the kettle")
        for _ in range(search.CANDIDATES + 5))
    assert found(alice, '"kettle boils"') == [old.pk]
    assert found(alice, 'kettle -"boils the"') == [old.pk]
    assert found(alice, "kettle boils")[0] == recent.pk

CODE_LIKE = [
    pytest.param("How do I center a <div> in CSS?", "div", id="html-tag"),
    pytest.param("In Java, List<String> is generic", "string", id="generic-type"),
    pytest.param("Write to bob@example.com please", "example", id="email"),
    pytest.param("See https://docs.djangoproject.com/en/stable/ for it", "djangoproject",
                 id="url"),
    pytest.param("It is in /etc/nginx/sites-enabled/default.conf now", "nginx", id="path"),
    pytest.param("Escape it as &amp; in HTML", "amp", id="entity"),
]


@pytest.mark.parametrize(("text", "q"), CODE_LIKE)
def test_words_in_code_like_text_are_found_by_each_word(alias, text, q):
    alice = user_in(alias)
    talk = conversation(alice, text)
    titled = conversation(alice, title=text)
    assert set(found(alice, q)) == {talk.pk, titled.pk}
    assert set(found(alice, f"{q} -{q}")) == set()


def test_code_like_text_is_found_as_written_and_shown_as_written(alias):
    alice = user_in(alias)
    email = conversation(alice, "Mail bob@example.com or <div class=x>List<String></div>")
    conversation(alice, "com: example for bob")  # the same words, not as written
    assert found(alice, "bob@example.com") == [email.pk]
    assert found(alice, '"List<String>"') == [email.pk]
    assert found(alice, "example -bob@example.com") != [email.pk]
    [hit] = search.search(alice, "string")
    assert "bob@example.com" in hit.snippet and "&lt;div class=x&gt;" in hit.snippet
    assert "List&lt;<mark>String</mark>" in hit.snippet


FTS5_HOSTILE = ['"', '"unbalanced', "*", "AND", "a AND", "NEAR(", "NEAR(a b)", "col:word",
                "title : x", "^start", "-", "--", "- -x", "(", ")", "a OR", "OR", "{title}",
                "'", "%", "_", "\\", "\x00"]


@pytest.mark.parametrize("q", FTS5_HOSTILE)
def test_hostile_queries_are_plain_words(alias, q):
    alice = user_in(alias)
    conversation(alice, "AND NEAR col word title start plain")
    search.search(alice, q.replace("\x00", "") if alias == "postgres" else q)


def test_fts5_syntax_in_a_query_is_searched_as_words():
    alice = user_in("default")
    near = conversation(alice, "we met NEAR the station and talked")
    assert found(alice, "NEAR(") == [near.pk]
    assert found(alice, "near AND station") == [near.pk]
    assert found(alice, "station*") == [near.pk]


def test_the_generic_search_matches_every_word_newest_first():
    alice = user_in("default")
    older = conversation(alice, "Alpha beta gamma")
    newer = conversation(alice, "beta then ALPHA")
    only = conversation(alice, "only alpha")
    assert found(alice, "alpha beta", generic=True) == [newer.pk, older.pk]
    assert found(alice, "alpha -gamma", generic=True) == [only.pk, newer.pk]
    [hit, _] = search.search(alice, "beta", generic=True)
    assert "<mark>beta</mark>" in hit.snippet.lower()


def test_marked_escapes_and_marks_every_word():
    html = search.marked("x <b> Needle y needle " + "z" * 300, ["needle"])
    assert html.startswith("x &lt;b&gt; <mark>Needle</mark> y <mark>needle</mark>")
    assert html.endswith("…")


# --- The index on SQLite: its triggers, the check, the command ---------------------------------


def search_errors(alias: str = "default") -> list[str]:
    return [m.id for m in run_checks(databases=[alias]) if m.id.endswith("037")]


def test_a_remade_table_loses_its_triggers_the_check_says_so_and_the_command_mends_it():
    alice = user_in("default")
    conversation(alice, "before the remake")
    assert search_errors() == []
    connection = connections["default"]
    role = Message._meta.get_field("role")
    wider = role.clone()
    wider.set_attributes_from_name("role")
    wider.max_length = 20
    with connection.schema_editor() as editor:  # what a migration altering a field does
        editor.alter_field(Message, role, wider)
    try:
        assert "chatstream_message_fts_insert" in search_index.missing(connection)
        assert search_errors() == ["chatstream.E037"]
        conversation(alice, "after the remake")
        assert found(alice, "after") == []  # the index is out of step
        call_command("chatstream_rebuild_search")
        assert search_errors() == []
        assert len(found(alice, "remake")) == 2
        conversation(alice, "later still")
        assert len(found(alice, "later")) == 1  # the triggers are back
    finally:
        with connection.schema_editor() as editor:
            editor.alter_field(Message, wider, role)
        call_command("chatstream_rebuild_search")


def test_the_command_rebuilds_a_damaged_index():
    alice = user_in("default")
    talk = conversation(alice, "kept words", title="kept title")
    with connections["default"].cursor() as cursor:
        cursor.execute(f"DROP TRIGGER {next(iter(search_index.SQLITE_TRIGGERS))}")
        cursor.execute(f"INSERT INTO {search_index.MESSAGE_FTS}({search_index.MESSAGE_FTS}) "
                       "VALUES ('delete-all')")
        cursor.execute(f"DELETE FROM {search_index.TITLE_FTS}")
    assert found(alice, "kept") == []
    assert search_errors() == ["chatstream.E037"]
    call_command("chatstream_rebuild_search")
    assert found(alice, "kept") == [talk.pk]
    assert search.search(alice, "title")[0].message_id is None
    assert search_errors() == []


@pytest.mark.postgres
def test_postgres_indexes_are_used_checked_and_made_again_with_the_configuration(
        require_service, settings):
    require_service("PostgreSQL (CHATSTREAM_TEST_POSTGRES)", postgres_available)
    connection = connections["postgres"]
    alice = user_in("postgres")
    talk = conversation(alice, "Running runners ran")
    assert search_errors("postgres") == []
    statements: list[tuple[str, Any]] = []

    def kept(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(kept):  # the search's own statement, explained
        assert found(alice, "runners") == [talk.pk]
    [(sql, params)] = [(sql, p) for sql, p in statements if "websearch_to_tsquery" in sql]
    titles = (f"SELECT 1 FROM {search_index.CONVERSATIONS} c WHERE "
              f"{search_index.title_vector()} @@ {search_index.query('%s')}")
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = " ".join(row[0] for row in cursor.fetchall())
        cursor.execute(f"EXPLAIN {titles}", ["runners"])  # a search reads titles by user
        title_plan = " ".join(row[0] for row in cursor.fetchall())
        cursor.execute("SET enable_seqscan = on")
    assert search_index.MESSAGE_INDEX in plan and search_index.TITLE_INDEX in title_plan
    assert found(alice, "run") == []  # "simple": no stemming
    settings.CHATSTREAM_SEARCH_CONFIG = "english"
    assert found(alice, "run") == [talk.pk]  # right without the index, with stems
    assert search_errors("postgres") == ["chatstream.W037"]
    call_command("chatstream_rebuild_search", database="postgres")
    assert search_errors("postgres") == []
    settings.CHATSTREAM_SEARCH_CONFIG = "simple"
    call_command("chatstream_rebuild_search", database="postgres")
    assert search_errors("postgres") == []


@pytest.mark.postgres
def test_a_configuration_the_database_lacks_is_an_error_at_startup(require_service, settings):
    require_service("PostgreSQL (CHATSTREAM_TEST_POSTGRES)", postgres_available)
    settings.CHATSTREAM_SEARCH_CONFIG = "klingon"
    [error] = [m for m in run_checks(databases=["postgres"]) if m.id.startswith("chatstream")]
    assert error.id == "chatstream.E038" and "'klingon'" in error.msg
    assert search_errors("postgres") == []  # not the index's warning: its command would fail


# --- The page ---------------------------------------------------------------------------------


@pytest.fixture
def alice_client(make_user) -> tuple[Any, Client]:
    alice = make_user()
    client = Client()
    client.force_login(alice)
    return alice, client


def test_the_list_page_has_a_search_form_that_works_without_javascript(alice_client):
    alice, client = alice_client
    talk = conversation(alice, "Where is the <b>teapot</b>?", title="Kitchen")
    page = client.get("/chat/").content.decode()
    assert '<form role="search"' in page and 'for="cs-search-q"' in page
    assert f'action="{URL}"' in page and 'hx-target="#cs-results"' in page
    response = client.get(URL, {"q": "teapot"})
    body = response.content.decode()
    assert response.status_code == 200 and "<html" in body
    assert "<mark>teapot</mark>" in body and "&lt;b&gt;" in body
    assert f"{talk.get_absolute_url()}#exchange-{talk.messages.get().pk}" in body
    assert 'value="teapot"' in body


def test_htmx_gets_the_results_region_alone(alice_client):
    alice, client = alice_client
    conversation(alice, "teapot")
    response = client.get(URL, {"q": "teapot"}, headers={"HX-Request": "true"})
    assert "HX-Request" in response["Vary"]  # Back, from the browser's cache: the whole page
    body = response.content.decode()
    assert "<html" not in body and "<mark>teapot</mark>" in body
    assert "1 conversation matches" in body
    assert "0 conversations match" in client.get(URL, {"q": "kettle"},
                                                  headers={"HX-Request": "true"}).text


def test_an_empty_query_shows_the_normal_list(alice_client):
    alice, client = alice_client
    conversation(alice, "hello", title="Listed")
    for headers in ({}, {"HX-Request": "true"}):
        body = client.get(URL, {"q": "  "}, headers=headers).content.decode()
        assert "Listed" in body and "<mark>" not in body


def test_a_query_too_long_is_refused_with_a_sentence(alice_client):
    _alice, client = alice_client
    for headers in ({}, {"HX-Request": "true"}):
        response = client.get(URL, {"q": "x" * 201}, headers=headers)
        assert response.status_code == 400
        assert "at most 200 characters" in response.content.decode()
    assert client.get(URL, {"q": "x" * 200}).status_code == 200


def test_a_reply_links_to_the_exchange_it_answers(alice_client):
    alice, client = alice_client
    talk = conversation(alice, "question")
    prompt = talk.messages.get()
    generation = Generation.objects.create(conversation=talk, user=alice, prompt_message=prompt,
                                           model="fast", status="completed")
    Message.objects.create(conversation=talk, role="assistant", content="the answer",
                           generation=generation)
    body = client.get(URL, {"q": "answer"}).content.decode()
    assert f"{talk.get_absolute_url()}#exchange-{prompt.pk}" in body


def test_only_the_best_results_are_shown_and_the_page_says_so(alice_client):
    alice, client = alice_client
    for i in range(search.RESULTS + 1):
        conversation(alice, f"common word {i}")
    body = client.get(URL, {"q": "common"}).content.decode()
    assert body.count('class="cs-conversation-link cs-result"') == search.RESULTS
    assert f"Only the {search.RESULTS} best matches are shown" in body

"""Conversation search's PostgreSQL indexes made again on the text as searches now read it
(chatstream/domain/search_index.py, ``searched_text``): the words of code-like text (``<div>``,
``List<String>``, an email, a URL, a path) are words there, as they are on SQLite. Nothing on
other databases. An index already made as it should be (``CREATE INDEX CONCURRENTLY`` before
migrating) is kept."""

from django.db import migrations


def remake(apps, schema_editor):
    from chatstream.domain import search_index

    if schema_editor.connection.vendor != "postgresql":
        return
    stale = search_index.missing(schema_editor.connection)
    for index in stale:
        schema_editor.execute(f"DROP INDEX IF EXISTS {index}")
    if stale:
        search_index.install(schema_editor)


def unmake(apps, schema_editor):
    """Back to the indexes of 0013, on the text as it is written."""
    from chatstream.domain import search_index

    if schema_editor.connection.vendor != "postgresql":
        return
    cfg = search_index.config()
    for index in (search_index.MESSAGE_INDEX, search_index.TITLE_INDEX):
        schema_editor.execute(f"DROP INDEX IF EXISTS {index}")
    schema_editor.execute(
        f"CREATE INDEX {search_index.MESSAGE_INDEX} ON {search_index.MESSAGES} USING gin "
        f"((to_tsvector({cfg}, content))) WHERE role IN ({search_index.ROLES_SQL})")
    schema_editor.execute(
        f"CREATE INDEX {search_index.TITLE_INDEX} ON {search_index.CONVERSATIONS} USING gin "
        f"((to_tsvector({cfg}, title)))")


class Migration(migrations.Migration):
    dependencies = [("chatstream", "0013_search")]

    operations = [migrations.RunPython(remake, unmake)]

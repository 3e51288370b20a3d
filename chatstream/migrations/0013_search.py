"""The index of conversation search (chatstream/domain/search_index.py): GIN indexes on
PostgreSQL, FTS5 tables and their triggers on SQLite, nothing on other databases."""

from django.db import migrations


def install(apps, schema_editor):
    from chatstream.domain import search_index

    search_index.install(schema_editor)


def uninstall(apps, schema_editor):
    from chatstream.domain import search_index

    search_index.uninstall(schema_editor)


class Migration(migrations.Migration):
    dependencies = [("chatstream", "0012_money_quotas")]

    operations = [migrations.RunPython(install, uninstall)]

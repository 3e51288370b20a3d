"""Migrations: every model change ships with its migration."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_makemigrations_finds_no_model_change_without_a_migration():
    out = io.StringIO()
    try:
        call_command("makemigrations", "chatstream", check=True, dry_run=True, stdout=out,
                     stderr=out)
    except SystemExit:  # --check exits 1 when a migration is missing
        pytest.fail(f"The models changed without a migration:\n{out.getvalue()}")

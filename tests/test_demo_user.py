"""``manage.py chatstream_demo_user``: the demo's login, made or reset (``make demo`` runs it)."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def demo_user(*args: str) -> str:
    out = io.StringIO()
    call_command("chatstream_demo_user", *args, stdout=out)
    return out.getvalue()


def test_it_creates_a_staff_superuser_who_can_log_in_as_demo_demo():
    assert "Created the demo login 'demo' (password 'demo')" in demo_user()
    user = authenticate(username="demo", password="demo")
    assert user is not None
    assert user.is_staff and user.is_superuser


def test_run_again_it_resets_the_password_and_the_rights_of_the_same_user():
    demo_user()
    user = get_user_model().objects.get(username="demo")
    user.set_password("changed")
    user.is_staff = user.is_superuser = False
    user.save()

    assert "Reset the demo login 'demo'" in demo_user()
    assert get_user_model().objects.filter(username="demo").count() == 1
    user.refresh_from_db()
    assert user.check_password("demo")
    assert user.is_staff and user.is_superuser


def test_username_and_password_can_be_chosen():
    said = demo_user("--username", "show", "--password", "s3cret")
    assert "Created the demo login 'show' (password 's3cret')" in said
    assert authenticate(username="show", password="s3cret") is not None
    assert authenticate(username="show", password="demo") is None

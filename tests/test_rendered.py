"""chatstream.web.rendered: a finished reply rendered once, at its final save, and served from
its row by pages, followers, resumes and the admin until what it was rendered with changes."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from chatstream.models import Generation
from chatstream.stream import sweep
from chatstream.web import rendered
from chatstream.web.rendering import render_markdown

from .conftest import generation_id, read_events
from .test_admin import CONTENT, make_generation

TEXT = "Here is **one** [link](https://example.com/a).\n\n- a\n- b\n"
KEPT = '<p class="kept">from the row</p>'


def finished(browser: Any, use_model: Any, text: str = TEXT) -> tuple[str, Generation]:
    """A reply streamed to its end over HTTP: its stream URL and its row."""
    from urllib.parse import quote

    conversation = browser.new_conversation()
    url = browser.send(conversation, "Hi", use_model(f"default?tps=0&text={quote(text)}"))
    with browser.client.stream("GET", url) as response:
        assert [name for _at, name, _data in read_events(response)][-1] == "done"
    return conversation, Generation.objects.get(pk=generation_id(url))


def test_the_final_save_keeps_the_text_rendered_with_its_key(make_user, browser_for, use_model):
    _conversation, generation = finished(browser_for(make_user()), use_model)
    assert generation.content == TEXT
    assert generation.content_html == render_markdown(TEXT)
    assert generation.content_html_key == rendered.key()


def test_a_page_serves_the_kept_html_without_rendering_again(make_user, browser_for, use_model):
    browser = browser_for(make_user())
    conversation, generation = finished(browser, use_model)
    Generation.objects.filter(pk=generation.pk).update(content_html=KEPT)
    page = browser.client.get(conversation).text
    assert KEPT in page and "<strong>one</strong>" not in page


def test_a_changed_setting_renders_again_and_the_page_keeps_the_new_html(
        make_user, browser_for, use_model, settings):
    browser = browser_for(make_user())
    conversation, generation = finished(browser, use_model)
    Generation.objects.filter(pk=generation.pk).update(content_html=KEPT)
    old_key = generation.content_html_key
    settings.CHATSTREAM_ALLOWED_LINK_HOSTS = []  # links become their text and their URL
    page = browser.client.get(conversation).text
    assert KEPT not in page
    assert "link (https://example.com/a)" in page and 'href="https://example.com/a"' not in page
    generation.refresh_from_db()
    assert generation.content_html_key == rendered.key() != old_key
    assert generation.content_html == render_markdown(TEXT)


def test_replies_rendered_again_are_kept_in_one_query(make_user, django_assert_num_queries):
    user = make_user()
    first = make_generation(user, content=TEXT)
    for _ in range(4):
        make_generation(user, content=TEXT, conversation=first.conversation)
    shown = list(Generation.objects.all())
    with django_assert_num_queries(1):
        rendered.keep(shown)
    kept = list(Generation.objects.all())
    assert {(g.content_html, g.content_html_key) for g in kept} == {
        (render_markdown(TEXT), rendered.key())}
    with django_assert_num_queries(0):
        rendered.keep(kept)


@pytest.mark.parametrize("after", [0, 5], ids=["follower", "resume"])
def test_the_stream_of_a_finished_reply_carries_the_kept_html(
        make_user, browser_for, use_model, after):
    browser = browser_for(make_user())
    _conversation, generation = finished(browser, use_model)
    Generation.objects.filter(pk=generation.pk).update(content_html=KEPT)
    url = reverse("chatstream:generation-stream", args=[generation.pk])
    with browser.client.stream("GET", f"{url}?after={after}") as response:
        events = list(read_events(response))
    names = [name for _at, name, _data in events]
    # The final message is the kept HTML, not rendered again. A follower that shows none of
    # the reply gets no block; a resume gets the blocks of the text it shows (nothing may be
    # left as text for `done` to replace: see test_markdown_blocks.py).
    assert names[-1] == "done" and ("block" in names) == bool(after)
    assert KEPT in events[-1][2]


def reviewing(client: Any, make_user: Any) -> Any:
    """``client`` logged in as staff that may read conversations in the admin."""
    from django.contrib.auth.models import Permission

    reviewer = make_user("reviewer", is_staff=True)
    reviewer.user_permissions.set(Permission.objects.filter(
        content_type__app_label="chatstream", codename__in=CONTENT))
    client.force_login(reviewer)
    return client


def test_the_admin_shows_the_kept_html(client, make_user):
    generation = make_generation(make_user(), content=TEXT, content_html=KEPT,
                                 content_html_key=rendered.key())
    page = reviewing(client, make_user).get(
        reverse("admin:chatstream_generation_change", args=[generation.pk]))
    assert KEPT in page.content.decode()


def test_the_admin_renders_a_reply_kept_with_another_key_and_keeps_it(client, make_user):
    generation = make_generation(make_user(), content=TEXT, content_html=KEPT,
                                 content_html_key="an older renderer")
    page = reviewing(client, make_user).get(
        reverse("admin:chatstream_generation_change", args=[generation.pk]))
    assert KEPT not in page.content.decode()
    generation.refresh_from_db()
    assert (generation.content_html, generation.content_html_key) == (
        render_markdown(TEXT), rendered.key())


def test_the_key_follows_the_settings_the_rendering_reads(settings):
    plain = rendered.key()
    settings.CHATSTREAM_ALLOWED_IMAGE_HOSTS = ["img.example.com"]
    images = rendered.key()
    settings.CHATSTREAM_ALLOWED_IMAGE_HOSTS = ["IMG.example.com", "img.example.com"]
    assert rendered.key() == images != plain  # the same hosts, however written
    settings.CHATSTREAM_ALLOWED_LINK_HOSTS = []
    assert rendered.key() not in (plain, images)


def test_the_key_follows_the_renderer_and_its_libraries():
    from importlib.metadata import version

    described = rendered._renderer()
    assert f"pygments=={version('pygments')}" in described
    assert f"nh3=={version('nh3')}" in described
    assert "def render_markdown(" in described  # the renderer's own code
    assert "HIGHLIGHTED_LEXERS = " in described  # and its highlighting's


@pytest.mark.django_db
def test_a_swept_reply_is_kept_rendered(make_user):
    stale = timezone.now() - timedelta(hours=1)
    generation = make_generation(make_user(), content=TEXT, status="streaming",
                                 heartbeat_at=stale, duration_ms=None)
    assert sweep()["interrupted"] == 1
    generation.refresh_from_db()
    assert generation.status == "interrupted"
    assert generation.content_html == render_markdown(TEXT)
    assert generation.content_html_key == rendered.key()


def test_long_rendering_runs_in_a_thread_and_short_rendering_here():
    async def where(size: int) -> int:
        return await rendered.off_loop(size, threading.get_ident)

    async def both() -> tuple[int, int, int]:
        return (threading.get_ident(), await where(rendered.INLINE_LIMIT),
                await where(rendered.INLINE_LIMIT + 1))

    loop_thread, short, long = asyncio.run(both())
    assert short == loop_thread != long

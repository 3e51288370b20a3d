"""The multi-process harness itself: two uvicorn workers on the tests' SQLite file."""

from __future__ import annotations

import pytest

from chatstream.models import Generation

from .conftest import Browser, generation_id
from .workers import Workers

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_workers_serve_a_stream_from_the_shared_database(make_user, simulator):
    user = make_user()
    with Workers(workers=2) as workers:
        browser = Browser(workers.url, user)
        stream_url = browser.send(browser.new_conversation(), "Hi", "fast")
        body = browser.client.get(stream_url).text
        browser.close()
    assert "event: done" in body
    generation = Generation.objects.get(pk=generation_id(stream_url))
    assert generation.status == Generation.Status.COMPLETED
    assert generation.worker and generation.content
    assert len(simulator.requests) == 1

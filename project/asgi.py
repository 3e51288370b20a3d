"""ASGI entry point of the demo site: ``uvicorn project.asgi:application``.

``with_fast_streams`` serves chatstream's ticketed stream requests in front of Django's request
cycle (see chatstream/asgi.py); everything else is Django as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application
from django.http import HttpRequest, HttpResponseBase

from chatstream.asgi import with_fast_streams

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")


class StaticFilesHandler(ASGIStaticFilesHandler):
    """Django's static files handler for ASGI, which also closes the file of a request whose
    client went away before the response was ready.

    Django opens the file in a worker thread (``sync_to_async``). A client that disconnects
    meanwhile (a browser leaving a page while its favicon loads) has the request's task
    cancelled; the thread runs on, and the ``FileResponse`` it returns, with its open file, is
    dropped without ``close()``: the garbage collector closes the file some time later, with a
    ``ResourceWarning``. Here the thread's answer is waited for apart from the request, so a
    response nobody will send has its file closed as soon as the thread returns it.
    """

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        serving = asyncio.ensure_future(super().get_response_async(request))
        try:
            return await asyncio.shield(serving)
        except asyncio.CancelledError:
            serving.add_done_callback(_close_unsent)
            raise


def _close_unsent(serving: asyncio.Future[Any]) -> None:
    """Release what a static response that will never be sent holds: its file.

    What ``response.close()`` does, less the ``request_finished`` signal: Django has already
    sent it for the aborted request. (``file_to_stream`` can't be used: the ASGI handler has
    replaced the response's content with an async iterator, which clears it.)
    """
    if serving.cancelled() or serving.exception() is not None:
        return
    response = serving.result()
    for close in response._resource_closers:
        with contextlib.suppress(Exception):  # as in response.close()
            close()
    response._resource_closers.clear()


django_application = get_asgi_application()

if settings.DEBUG:
    # uvicorn serves no static files; in production a web server or WhiteNoise does.
    django_application = StaticFilesHandler(django_application)

application = with_fast_streams(django_application)

"""ASGI entry point of the demo site: ``uvicorn project.asgi:application``.

``with_fast_streams`` serves chatstream's ticketed stream requests in front of Django's request
cycle (see chatstream/asgi.py); everything else is Django as usual.
"""

import os

from django.conf import settings
from django.core.asgi import get_asgi_application

from chatstream.asgi import with_fast_streams

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

django_application = get_asgi_application()

if settings.DEBUG:
    # uvicorn serves no static files; in production a web server or WhiteNoise does.
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    django_application = ASGIStaticFilesHandler(django_application)

application = with_fast_streams(django_application)

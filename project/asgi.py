"""ASGI entry point of the demo site: ``uvicorn project.asgi:application``."""

import os

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

application = get_asgi_application()

if settings.DEBUG:
    # uvicorn serves no static files; in production a web server or WhiteNoise does.
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    application = ASGIStaticFilesHandler(application)

"""The project's settings, as they are, with ``bench/django_floor.py`` as the URLconf."""

from project.settings import *  # noqa: F403

ROOT_URLCONF = "bench.django_floor"

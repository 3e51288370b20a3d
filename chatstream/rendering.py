"""Moved to :mod:`chatstream.web.rendering`; this path keeps working for what the docs name here."""

from .web.rendering import *  # noqa: F403

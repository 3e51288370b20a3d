"""Moved to :mod:`chatstream.web.rendered`; this path keeps working for what the docs name here."""

from .web.rendered import *  # noqa: F403

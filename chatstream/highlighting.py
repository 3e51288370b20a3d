"""Moved to :mod:`chatstream.web.highlighting`; this path keeps working for what the docs
name here."""

from .web.highlighting import *  # noqa: F403

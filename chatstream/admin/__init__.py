"""chatstream's admin: one module per area, registered on import."""

from . import generations  # noqa: F401

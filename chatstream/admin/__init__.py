"""chatstream's admin: one module per area, registered on import."""

from . import conversations, feedback, generations, quotas  # noqa: F401  (imported to register)

"""chatstream's admin: one module per area, registered on import."""

from . import attempts, conversations, feedback, generations, quotas, tools  # noqa: F401  (to register)

"""chatstream's admin: one module per area, registered on import."""

from . import conversations  # noqa: F401
from . import generations  # noqa: F401
from . import quotas  # noqa: F401

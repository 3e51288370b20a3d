"""Failures logged without their exception's message, which may quote what a user wrote.

A request hook's exception, a signal receiver's or anything a view failed on can carry the
text it was handed (a message, a reply, a request body): log lines above DEBUG never hold user
text (docs/security.md). They say what failed, the exception's type and where it was raised
(the traceback's frames, which show code, not values); the message itself goes to DEBUG only.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any


def log_failure(logger: logging.Logger, error: BaseException, message: str, *args: Any,
                level: int = logging.ERROR, extra: dict[str, Any] | None = None) -> None:
    """Log ``message % args`` at ``level`` with ``error``'s type and frames, not its words;
    the whole exception at DEBUG."""
    frames = "".join(traceback.format_tb(error.__traceback__)).rstrip()
    logger.log(level, f"{message} (%s); its message is logged at DEBUG. Traceback (most recent "
               "call last):\n%s", *args, type(error).__name__, frames, extra=extra)
    logger.debug(message, *args, exc_info=error)

"""chatstream's models: the chat records, what users say of the replies, and the quotas
that meter them."""

from __future__ import annotations

from .chat import Conversation, Generation, Message
from .feedback import Feedback
from .quotas import (
    QUOTA_MAXIMUMS,
    GroupQuota,
    QuotaAccount,
    QuotaCharge,
    QuotaOverride,
    UserQuota,
)

__all__ = [
    "QUOTA_MAXIMUMS",
    "Conversation",
    "Feedback",
    "Generation",
    "GroupQuota",
    "Message",
    "QuotaAccount",
    "QuotaCharge",
    "QuotaOverride",
    "UserQuota",
]

"""chatstream's models: the chat records, what users say of the replies, the quotas that
meter them, the tool calls the replies asked for, and each upstream call made."""

from __future__ import annotations

from .attempts import LOADED_ATTEMPTS, Attempt, Cooldown
from .chat import Conversation, Generation, Message
from .feedback import Feedback
from .quotas import (
    MONEY_MAXIMUMS,
    QUOTA_MAXIMUMS,
    GroupQuota,
    QuotaAccount,
    QuotaCharge,
    QuotaOverride,
    UserQuota,
)
from .tools import ToolCall

__all__ = [
    "LOADED_ATTEMPTS",
    "MONEY_MAXIMUMS",
    "QUOTA_MAXIMUMS",
    "Attempt",
    "Conversation",
    "Cooldown",
    "Feedback",
    "Generation",
    "GroupQuota",
    "Message",
    "QuotaAccount",
    "QuotaCharge",
    "QuotaOverride",
    "ToolCall",
    "UserQuota",
]

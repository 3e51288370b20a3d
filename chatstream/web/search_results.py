"""A search's results as the page shows them: each conversation found, its snippet, and the
address of the exchange its match is in (domain/search.py finds them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.utils.safestring import SafeString

from ..domain import search
from ..models import Conversation, Message
from . import windows


@dataclass
class Result:
    conversation: Conversation
    snippet: SafeString
    url: str
    in_title: bool


def results(user: Any, q: str) -> tuple[list[Result], bool]:
    """The best ``search.RESULTS`` conversations of ``user`` matching ``q``, and whether more
    matched."""
    hits = search.search(user, q, limit=search.RESULTS + 1)
    shown = hits[:search.RESULTS]
    exchanges = _exchanges(user, [hit.message_id for hit in shown if hit.message_id])
    return [Result(hit.conversation, hit.snippet, _url(hit, exchanges), hit.message_id is None)
            for hit in shown], len(hits) > search.RESULTS


def _exchanges(user: Any, message_ids: list[int]) -> dict[int, Message]:
    """The user message of each matching message's exchange: itself, or the one a reply
    answers (two queries)."""
    db = user._state.db
    prompts = dict(Message.objects.using(db).filter(pk__in=message_ids)
                   .values_list("pk", "generation__prompt_message"))
    wanted = {pk: prompt or pk for pk, prompt in prompts.items()}
    found = Message.objects.using(db).filter(pk__in=set(wanted.values()),
                                             role=Message.Role.USER).in_bulk()
    return {pk: found[prompt] for pk, prompt in wanted.items() if prompt in found}


def _url(hit: search.Hit, exchanges: dict[int, Message]) -> str:
    """The exchange of the match (its page, or its version's), else the conversation."""
    exchange = exchanges.get(hit.message_id or 0)
    if exchange is None:
        return hit.conversation.get_absolute_url()
    return windows.exchange_url(hit.conversation, exchange)

"""Prices and costs: a model's ``PRICE`` read, what a reply's usage cost, what a hold may cost.

A price is per million tokens, in ``CHATSTREAM_CURRENCY``, written as decimal strings; every
figure here is a :class:`~decimal.Decimal`, never a float. docs/costs.md is the reference.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from ..conf import conf

if TYPE_CHECKING:
    from ..models import Generation

PRICE_KEYS = ("INPUT", "CACHED_INPUT", "OUTPUT", "REASONING")
REQUIRED_KEYS = ("INPUT", "OUTPUT")
MILLION = Decimal(1_000_000)
# The places of Generation.cost and of the ledger's money columns.
PLACES = Decimal("1e-10")


def amount(value: object) -> Decimal:
    """``value`` (a decimal string, or a Decimal) as a finite Decimal >= 0, else ValueError."""
    if not isinstance(value, str | Decimal):
        raise ValueError(f"{value!r} is not a decimal string")
    try:
        number = Decimal(value.strip() if isinstance(value, str) else value)
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a decimal number") from None
    if not number.is_finite() or number < 0:
        raise ValueError(f"{value!r} is not a finite amount, 0 or more")
    return number


@dataclass(frozen=True)
class Price:
    """A model's prices per million tokens."""

    input: Decimal
    cached_input: Decimal
    output: Decimal
    reasoning: Decimal | None = None  # None: reasoning is priced as output

    @classmethod
    def parse(cls, raw: object) -> Price:
        """The price a ``PRICE`` setting gives, or ValueError saying what is wrong with it."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"{raw!r} is not a dict")
        unknown = [key for key in raw if key not in PRICE_KEYS]
        missing = [key for key in REQUIRED_KEYS if key not in raw]
        if unknown or missing:
            raise ValueError(f"unknown keys {unknown!r}" if unknown else f"no {missing[0]}")
        values = {key.lower(): amount(value) for key, value in raw.items()}
        values.setdefault("cached_input", values["input"])
        return cls(**values)

    def of(self, *, prompt: int, cached: int = 0, completion: int, reasoning: int = 0
           ) -> Decimal:
        """What this usage costs (``prompt`` includes ``cached``, ``completion`` includes
        ``reasoning``, as providers count them), unrounded."""
        cached = min(cached, prompt)
        thinking = min(reasoning, completion) if self.reasoning is not None else 0
        return ((prompt - cached) * self.input + cached * self.cached_input
                + (completion - thinking) * self.output
                + thinking * (self.reasoning or self.output)) / MILLION

    @property
    def dearest_output(self) -> Decimal:
        """The price of an output token at the most: a reply may be all reasoning."""
        return max(self.output, self.reasoning or self.output)


def price_of(model_key: str) -> Price | None:
    """``model_key``'s price, or None when it has none (or no valid one: the checks say so)."""
    model = conf.get_model(model_key)
    if model is None or model.price is None:
        return None
    try:
        return Price.parse(model.price)
    except ValueError:
        return None


def rounded(value: Decimal, rounding: str = ROUND_HALF_UP) -> Decimal:
    """``value`` at the places of the money columns."""
    return value.quantize(PLACES, rounding=rounding)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def cost_of(model_key: str, *, prompt: Any, cached: Any = 0, completion: Any,
            reasoning: Any = 0) -> Decimal | None:
    """What the usage cost with ``model_key``'s price (missing counts are none), rounded to
    ``Generation.cost``; None when the model has no price."""
    price = price_of(model_key)
    if price is None:
        return None
    return rounded(price.of(prompt=_count(prompt), cached=_count(cached),
                            completion=_count(completion), reasoning=_count(reasoning)))


def answered_by(generation: Generation, fields: Mapping[str, Any] | None = None) -> str:
    """The model whose call gave ``generation``'s reply (with its final ``fields``)."""
    return ((fields or {}).get("answered_by") or generation.answered_by or generation.model)


def cost_fields(generation: Generation, fields: Mapping[str, Any] | None = None
                ) -> dict[str, Any]:
    """``cost`` and ``currency`` for ``generation``'s final save: its usage (as ``fields``
    leave it) at the prices in force now; no usage costs nothing."""
    def usage(name: str) -> Any:
        return (fields or {}).get(name, getattr(generation, name))

    cost = cost_of(answered_by(generation, fields), prompt=usage("prompt_tokens"),
                   cached=usage("cached_tokens"), completion=usage("completion_tokens"),
                   reasoning=usage("reasoning_tokens"))
    return {"cost": cost, "currency": conf.CURRENCY if cost is not None else ""}


def hold_of(models: Iterable[str], *, prompt: int, max_tokens: int) -> Decimal | None:
    """The most a reply may cost: ``prompt`` tokens at INPUT and ``max_tokens`` at the dearest
    output price, with the dearest of ``models`` (the one asked for and its fallbacks), rounded
    up; None when one of them has no price."""
    prices = [price_of(key) for key in models]
    if not prices or any(price is None for price in prices):
        return None
    return rounded(max((prompt * price.input + max_tokens * price.dearest_output) / MILLION
                       for price in prices if price is not None), ROUND_CEILING)

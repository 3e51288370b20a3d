"""Prices and costs: the arithmetic, the cost of a generation at its final save (through the
real stream), and money quotas: refusal, Retry-After, the hold at the dearest fallback,
settlement, what users see. The burst of concurrent admissions against a money quota is in
tests/test_quota.py, beside the token ones."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.forms import modelform_factory
from django.test import Client
from django.utils import timezone

from chatstream import api, quota
from chatstream.models import Conversation, Generation, QuotaCharge, UserQuota
from chatstream.testing import Script

from .conftest import generation_id
from .test_quota import (
    MAX_TOKENS,
    charge_of,
    end,
    limit,
    post_message,
    refused,
    start,
)

Status = Generation.Status
Source = QuotaCharge.Source
PRICE = {"INPUT": "2.50", "CACHED_INPUT": "1.25", "OUTPUT": "10.00"}
DEAR = {"INPUT": "5.00", "OUTPUT": "40.00"}
PROMPT = 9  # the estimate of "Hello" in a new conversation
HOLD = (PROMPT * Decimal("2.50") + MAX_TOKENS * Decimal("10.00")) / 1_000_000  # 0.0102625


@pytest.fixture
def user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("alice", password="pw")


@pytest.fixture
def priced(settings: Any) -> Any:
    settings.CHATSTREAM_MODELS = {
        "fast": {"PROVIDER": "default", "MODEL": "fast", "PRICE": PRICE},
        "dear": {"PROVIDER": "default", "MODEL": "fast", "PRICE": DEAR},
        "free": {"PROVIDER": "default", "MODEL": "fast"},
    }
    return settings


# --- the arithmetic ----------------------------------------------------------------------------


def test_a_cost_prices_uncached_cached_and_output_tokens_each_at_its_price():
    price = quota.Price.parse(PRICE)
    # 1,000 prompt tokens of which 400 cached, 300 completion tokens of which 100 reasoning.
    assert price.of(prompt=1000, cached=400, completion=300, reasoning=100) == (
        (600 * Decimal("2.50") + 400 * Decimal("1.25") + 300 * Decimal("10.00")) / 1_000_000)
    thinking = quota.Price.parse({**PRICE, "REASONING": "20"})
    assert thinking.of(prompt=0, completion=300, reasoning=100) == (
        (200 * 10 + 100 * 20) / Decimal(1_000_000))
    assert quota.Price.parse({"INPUT": "3", "OUTPUT": "4"}).cached_input == 3  # INPUT's


def test_cost_of_is_exact_rounded_to_the_column_and_none_without_a_price(priced):
    cost = quota.cost_of("fast", prompt=1, cached=0, completion=1, reasoning=None)
    assert cost == Decimal("0.0000125000") and isinstance(cost, Decimal)
    assert quota.cost_of("fast", prompt=None, completion=None) == 0
    assert quota.cost_of("free", prompt=10, completion=10) is None


@pytest.mark.parametrize("raw", [
    {"INPUT": 2.5, "OUTPUT": "10"}, {"INPUT": "2.5"}, {"INPUT": "1", "OUTPUT": "-1"},
    {"INPUT": "1", "OUTPUT": "NaN"}, {"INPUT": "1", "OUTPUT": "Infinity"},
    {"INPUT": "1", "OUTPUT": "ten"}, {"INPUT": "1", "OUTPUT": "1", "CACHED": "1"}, "2.50",
], ids=["float", "no-output", "negative", "nan", "infinite", "words", "unknown-key",
        "not-a-dict"])
def test_a_bad_price_is_refused(raw):
    with pytest.raises(ValueError):
        quota.Price.parse(raw)


@pytest.mark.django_db
def test_the_cost_is_the_answering_models_and_a_later_price_never_changes_it(priced, user):
    generation = start(user)
    usage = {"prompt_tokens": 1000, "completion_tokens": 1000, "cached_tokens": 0,
             "reasoning_tokens": None}
    assert quota.cost_fields(generation, usage) == {"cost": Decimal("0.0125"), "currency": "USD"}
    stood_in = quota.cost_fields(generation, {**usage, "answered_by": "dear"})
    assert stood_in["cost"] == Decimal("0.045")
    assert quota.cost_fields(generation, {**usage, "answered_by": "free"}) == {
        "cost": None, "currency": ""}


# --- a generation's cost at its final save, through the real stream ----------------------------


def _stream(browser: Any, model: str) -> Generation:
    stream_url = browser.send(browser.new_conversation(), "Hello", model)
    assert "event: done" in browser.client.get(stream_url).text
    return Generation.objects.get(pk=generation_id(stream_url))


@pytest.mark.django_db(transaction=True)
def test_a_streamed_reply_is_costed_from_its_usage_in_its_final_save(
    settings, make_user, browser_for, simulator
):
    simulator.register("cached", Script(text="Hi there, " * 20, cached_tokens=4,
                                        first_token_delay=0, tokens_per_second=1000))
    settings.CHATSTREAM_MODELS = {"m": {"PROVIDER": "default", "MODEL": "cached",
                                        "PRICE": PRICE}}
    settings.CHATSTREAM_CURRENCY = "EUR"
    limit(settings, cost_per_day="1.00")
    generation = _stream(browser_for(make_user()), "m")
    assert generation.usage_source == Generation.UsageSource.PROVIDER
    assert generation.cached_tokens == 4
    expected = (Decimal(generation.prompt_tokens - 4) * Decimal("2.50") + 4 * Decimal("1.25")
                + generation.completion_tokens * Decimal("10.00")) / 1_000_000
    assert generation.cost == expected and generation.currency == "EUR"
    charge = charge_of(generation)
    assert charge.charged_cost == generation.cost  # money and tokens tell the same story
    assert charge.reserved_cost is not None and charge.charged_cost < charge.reserved_cost

    settings.CHATSTREAM_MODELS["m"]["PRICE"] = {"INPUT": "100", "OUTPUT": "100"}
    quota.settle(generation)  # settled already: nothing moves
    generation.refresh_from_db()
    assert generation.cost == expected


@pytest.mark.django_db(transaction=True)
def test_a_reply_without_usage_is_costed_at_the_estimate_the_quota_charges(
    settings, make_user, browser_for, simulator
):
    settings.CHATSTREAM_MODELS = {"m": {"PROVIDER": "default", "MODEL": "no-usage",
                                        "PRICE": PRICE}}
    generation = _stream(browser_for(make_user()), "m")
    assert generation.usage_source == Generation.UsageSource.ESTIMATED
    assert generation.cost == quota.cost_of("m", prompt=generation.prompt_tokens,
                                            completion=generation.completion_tokens) > 0
    charge = charge_of(generation)
    assert charge.charged == generation.prompt_tokens + generation.completion_tokens
    assert charge.charged_cost == generation.cost


@pytest.mark.django_db(transaction=True)
def test_a_failed_reply_costs_nothing_and_an_unpriced_one_has_no_cost(
    settings, make_user, browser_for, simulator
):
    settings.CHATSTREAM_MODELS = {"m": {"PROVIDER": "default", "MODEL": "http-500",
                                        "PRICE": PRICE},
                                  "free": {"PROVIDER": "default", "MODEL": "fast"}}
    browser = browser_for(make_user())
    stream_url = browser.send(browser.new_conversation(), "Hello", "m")
    browser.client.get(stream_url)
    failed = Generation.objects.get(pk=generation_id(stream_url))
    assert failed.status == Status.FAILED
    assert failed.cost == 0 and failed.currency == "USD"
    assert charge_of(failed).charged_cost == 0
    free = _stream(browser, "free")
    assert free.cost is None and free.currency == ""
    assert charge_of(free).reserved_cost is None and charge_of(free).charged_cost is None


@pytest.mark.django_db
def test_stop_of_a_pending_reply_and_the_sweeper_cost_it_too(priced, user):
    from django.core.management import call_command

    from chatstream import store

    pending = start(user)
    cancelled = store.cancel_pending(pending.pk, reason="stopped", error_type="stopped_by_user",
                                     settlement=quota.RELEASED)
    assert cancelled is not None and cancelled.cost == 0 and cancelled.currency == "USD"
    assert Generation.objects.get(pk=pending.pk).cost == 0
    left = start(user)
    Generation.objects.filter(pk=left.pk).update(
        status=Status.STREAMING, content="Hello " * 50, heartbeat_at=timezone.now()
        - timedelta(minutes=5))
    priced.CHATSTREAM_STALE_AFTER = 1
    call_command("chatstream_sweep", verbosity=0)
    left.refresh_from_db()
    assert left.status == Status.INTERRUPTED
    assert left.cost == quota.cost_of("fast", prompt=left.prompt_tokens,
                                      completion=left.completion_tokens) > 0
    assert charge_of(left).charged_cost == left.cost


# --- money quotas --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_hold_is_priced_at_the_dearest_model_the_reply_may_fall_back_to(priced, user):
    generation = start(user)
    assert charge_of(generation).reserved_cost == HOLD
    with transaction.atomic():
        conversation = Conversation.objects.create(user=user, model="fast")
        from chatstream.models import Message

        message = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                         content="Hello")
        backed = Generation.objects.create(conversation=conversation, user=user,
                                           prompt_message=message, model="fast",
                                           fallbacks=["dear"])
        charge = quota.admit(backed)
    assert charge.reserved_cost == (PROMPT * 5 + MAX_TOKENS * 40) / Decimal(1_000_000)
    assert quota.hold_of(["fast", "free"], prompt=PROMPT, max_tokens=MAX_TOKENS) is None


@pytest.mark.django_db
def test_spend_per_day_refuses_with_the_amount_and_when_enough_frees_up(priced, user):
    limit(priced, cost_per_day=str(HOLD))
    client = Client(headers={"HX-Request": "true"})
    client.force_login(user)
    assert post_message(client, Conversation.objects.create(user=user, model="fast")
                        ).status_code == 200
    end(Generation.objects.get(), prompt=9, completion=100)
    assert charge_of(Generation.objects.get()).charged_cost == Decimal("0.0010225")
    response = post_message(client, Conversation.objects.create(user=user, model="fast"))
    assert response.status_code == 429
    assert int(response["Retry-After"]) == 24 * 3600
    assert "You have spent your 0.0103 USD for the last 24 hours" in response.content.decode()
    assert Generation.objects.count() == 1 and QuotaCharge.objects.count() == 1


@pytest.mark.django_db
def test_spend_held_by_replies_in_flight_refuses_with_a_short_retry(priced, user):
    limit(priced, cost_per_day=str(HOLD * 3 / 2))
    start(user)
    refusal = refused(user)
    assert refusal.limit == "cost_per_day"
    assert refusal.retry_after == quota.IN_FLIGHT_RETRY_AFTER
    assert "still being written hold the rest of your 0.0154 USD per 24 hours" in (
        refusal.message)


@pytest.mark.django_db
def test_a_message_dearer_than_the_whole_limit_is_refused_without_a_retry(priced, user):
    limit(priced, cost_per_month="0.01")
    refusal = refused(user)
    assert refusal.limit == "cost_per_month" and refusal.retry_after is None
    assert "may cost up to 0.0103 USD" in refusal.message
    assert "more than your limit of 0.0100 USD per month" in refusal.message


@pytest.mark.django_db
def test_spend_per_month_resets_on_the_first(priced, user):
    from .test_quota import PARIS

    priced.TIME_ZONE = "Europe/Paris"
    limit(priced, cost_per_month=str(HOLD))
    from datetime import datetime

    end(start(user, now=datetime(2026, 1, 10, 12, 0, tzinfo=PARIS)))
    refusal = refused(user, now=datetime(2026, 1, 31, 23, 0, tzinfo=PARIS))
    assert refusal.limit == "cost_per_month" and refusal.retry_after == 3600
    assert "resets on 1 February 2026, 00:00 (Europe/Paris)" in refusal.message
    start(user, now=datetime(2026, 2, 1, 0, 0, tzinfo=PARIS))


@pytest.mark.django_db
def test_a_model_without_a_price_is_refused_under_a_money_limit(priced, user):
    limit(priced, cost_per_day="5")
    refusal = refused(user, model="free")
    assert refusal.retry_after is None and "“free” has no price" in refusal.message
    start(user, model="fast")


@pytest.mark.django_db
def test_under_a_money_limit_a_fallback_without_a_price_is_left_out(priced, user):
    # The limit is the user's own, which no check at startup sees: the reply is admitted and
    # may fall back only to a model whose cost the limit can count.
    priced.CHATSTREAM_MODELS["fast"]["FALLBACKS"] = ["free", "dear"]
    UserQuota.objects.create(user=user, cost_per_day=Decimal("5"))
    generation = api.send(user, "Hello", model="fast")
    assert generation.fallbacks == ["dear"]
    assert Generation.objects.get(pk=generation.pk).fallbacks == ["dear"]
    assert charge_of(generation).reserved_cost == (
        PROMPT * 5 + MAX_TOKENS * 40) / Decimal(1_000_000)
    # A user without a money limit keeps it.
    bob = get_user_model().objects.create_user("bob")
    assert api.send(bob, "Hello", model="fast").fallbacks == ["free", "dear"]

@pytest.mark.django_db
def test_settlement_charges_the_real_cost_and_releases_the_rest(priced, user):
    limit(priced, cost_per_day="1")
    done, failed, orphan = start(user), start(user), start(user)
    end(done, prompt=1000, completion=2000)
    end(failed, status=Status.FAILED, usage_source="none", prompt=None, completion=None,
        content="")
    assert charge_of(done).charged_cost == Decimal("0.0225")
    assert charge_of(failed).charged_cost == 0
    assert quota.usage(user).cost_day == Decimal("0.0225") + HOLD  # the orphan's hold
    assert quota.usage(user).held_cost_day == HOLD
    # An outcome nobody knows: the whole hold is kept, in money as in tokens.
    Generation.objects.filter(pk=orphan.pk).update(status=Status.FAILED,
                                                   usage_source="unknown")
    quota.settle_orphans(user)
    assert charge_of(orphan).charged_cost == HOLD
    assert quota.usage(user).cost_day == Decimal("0.0225") + HOLD
    assert quota.usage(user).held_cost_day == 0


@pytest.mark.django_db
def test_remaining_tells_the_money_left(priced, user):
    limit(priced, cost_per_day="5", cost_per_month="100")
    end(start(user), usage_source="estimated", prompt=400_000, completion=100_000)  # 1 + 1
    assert str(quota.remaining(user)) == (
        "3.00 USD of 5.00 USD left to spend (rolling 24 hours) · 98.00 USD of 100.00 USD left "
        "to spend this month")


@pytest.mark.django_db
def test_overrides_set_money_limits_and_the_most_generous_group_wins(priced, user):
    from django.contrib.auth.models import Group

    from chatstream.models import GroupQuota

    limit(priced, cost_per_day="1")
    group = Group.objects.create(name="g")
    user.groups.add(group)
    GroupQuota.objects.create(group=group, cost_per_day=Decimal("7.5"))
    assert quota.limits_for(user).cost_per_day == Decimal("7.5")
    UserQuota.objects.create(user=user, unlimited_cost_per_day=True)
    assert quota.limits_for(user).cost_per_day is None


@pytest.mark.django_db
@pytest.mark.parametrize("data", [
    {"cost_per_day": "0"}, {"cost_per_day": "-1"}, {"cost_per_month": "1e12"},
    {"cost_per_day": "2", "unlimited_cost_per_day": "on"},
], ids=["zero", "negative", "absurd", "amount-and-unlimited"])
def test_override_form_rejects_bad_money_limits(user, data):
    form = modelform_factory(UserQuota, exclude=[])(data={"user": user.pk, **data})
    assert not form.is_valid()
    assert next(iter(data)) in form.errors, form.errors


@pytest.mark.django_db
def test_the_database_refuses_a_zero_money_limit(user):
    with pytest.raises(IntegrityError), transaction.atomic():
        UserQuota.objects.create(user=user, cost_per_day=Decimal(0))


@pytest.mark.parametrize("value", [0, "0", "-1", 1.5, "NaN", "1e20", True])
def test_a_bad_money_limit_in_the_setting_is_refused(settings, value):
    from chatstream.checks import check_quota

    limit(settings, cost_per_day=value)
    errors = check_quota()
    assert [e.id for e in errors] == ["chatstream.E022"]
    assert repr(value) in errors[0].msg and errors[0].hint

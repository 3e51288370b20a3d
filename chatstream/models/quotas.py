"""Quotas: per-user limits, their overrides (per user, per group), and the usage ledger.

The logic lives in :mod:`chatstream.quota`; docs/quotas.md is the reference.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

# The largest value each limit accepts: anything above is a typo, not a plan.
QUOTA_MAXIMUMS: dict[str, int] = {
    "tokens_per_day": 10**12,
    "tokens_per_month": 10**13,
    "requests_per_minute": 10**6,
    "concurrent_streams": 10**4,
    "max_prompt_tokens": 10**9,
}

# The largest money limit, in CHATSTREAM_CURRENCY; a money limit is more than zero.
MONEY_MAXIMUMS: dict[str, Decimal] = {
    "cost_per_day": Decimal(10**9),
    "cost_per_month": Decimal(10**10),
}
MONEY_PLACES = 4


def _money(name: str, verbose_name: StrOrPromise, help_text: StrOrPromise
           ) -> models.DecimalField:
    from django.core.validators import MaxValueValidator, MinValueValidator

    return models.DecimalField(
        verbose_name, max_digits=11 + MONEY_PLACES, decimal_places=MONEY_PLACES, null=True,
        blank=True, help_text=help_text,
        validators=[MinValueValidator(Decimal("0.0001")),
                    MaxValueValidator(MONEY_MAXIMUMS[name])],
    )


def _cost(verbose_name: StrOrPromise, help_text: StrOrPromise) -> models.DecimalField:
    """A cost, in CHATSTREAM_CURRENCY, at Generation.cost's places; empty: no price."""
    return models.DecimalField(verbose_name, max_digits=20, decimal_places=10, null=True,
                               blank=True, help_text=help_text)


def _limit(name: str, verbose_name: StrOrPromise, help_text: StrOrPromise
           ) -> models.PositiveBigIntegerField:
    from django.core.validators import MaxValueValidator, MinValueValidator

    return models.PositiveBigIntegerField(
        verbose_name, null=True, blank=True, help_text=help_text,
        validators=[MinValueValidator(1), MaxValueValidator(QUOTA_MAXIMUMS[name])],
    )


def _above_zero(name: str) -> dict[str, int]:
    return {f"{name}__gt": 0} if name in MONEY_MAXIMUMS else {f"{name}__gte": 1}


def _override_constraints(prefix: str) -> list[models.BaseConstraint]:
    """Database-level twins of ``QuotaOverride.clean``: no zero, no absurd value, no both."""
    rules: list[models.BaseConstraint] = [
        models.CheckConstraint(
            condition=models.Q(**{f"{name}__isnull": True})
            | models.Q(**_above_zero(name), **{f"{name}__lte": maximum,
                                               f"unlimited_{name}": False}),
            name=f"{prefix}_{name}_valid",
            violation_error_message=(
                f"{name} must be empty (inherit), a number "
                f"{'above 0 up' if name in MONEY_MAXIMUMS else 'from 1'} to {maximum}, or "
                "unlimited."
            ),
        )
        for name, maximum in (QUOTA_MAXIMUMS | MONEY_MAXIMUMS).items()
    ]
    rules.append(models.CheckConstraint(
        condition=models.Q(allowed_models="") | models.Q(all_models=False),
        name=f"{prefix}_models_valid",
        violation_error_message="List allowed models or allow every model, not both.",
    ))
    return rules


class QuotaOverride(models.Model):
    """Limits that replace the site default: empty inherits, a number limits, a flag lifts it."""

    tokens_per_day = _limit(
        "tokens_per_day", _("tokens per 24 hours"),
        _("Prompt + completion tokens in any rolling 24 hours. Empty: inherit."),
    )
    unlimited_tokens_per_day = models.BooleanField(_("no limit on tokens per 24 hours"),
                                                   default=False)
    tokens_per_month = _limit(
        "tokens_per_month", _("tokens per month"),
        _("Prompt + completion tokens per calendar month in the site's TIME_ZONE. "
          "Empty: inherit."),
    )
    unlimited_tokens_per_month = models.BooleanField(_("no limit on tokens per month"),
                                                     default=False)
    requests_per_minute = _limit(
        "requests_per_minute", _("requests per minute"),
        _("Replies started in any rolling 60 seconds. Empty: inherit."),
    )
    unlimited_requests_per_minute = models.BooleanField(_("no limit on requests per minute"),
                                                        default=False)
    concurrent_streams = _limit(
        "concurrent_streams", _("concurrent replies"),
        _("Replies pending or streaming at the same time. Empty: inherit."),
    )
    unlimited_concurrent_streams = models.BooleanField(_("no limit on concurrent replies"),
                                                       default=False)
    max_prompt_tokens = _limit(
        "max_prompt_tokens", _("largest prompt (tokens)"),
        _("Estimated tokens of the conversation sent upstream. Empty: inherit."),
    )
    unlimited_max_prompt_tokens = models.BooleanField(_("no limit on prompt size"), default=False)
    cost_per_day = _money(
        "cost_per_day", _("spend per 24 hours"),
        _("What replies may cost in any rolling 24 hours, in CHATSTREAM_CURRENCY. "
          "Empty: inherit."),
    )
    unlimited_cost_per_day = models.BooleanField(_("no limit on spend per 24 hours"),
                                                 default=False)
    cost_per_month = _money(
        "cost_per_month", _("spend per month"),
        _("What replies may cost per calendar month in the site's TIME_ZONE, in "
          "CHATSTREAM_CURRENCY. Empty: inherit."),
    )
    unlimited_cost_per_month = models.BooleanField(_("no limit on spend per month"),
                                                   default=False)
    allowed_models = models.CharField(
        _("allowed models"), max_length=1000, blank=True,
        help_text=_("Keys of CHATSTREAM_MODELS, separated by commas. Empty: inherit."),
    )
    all_models = models.BooleanField(_("every model allowed"), default=False)
    note = models.CharField(_("note"), max_length=200, blank=True,
                            help_text=_("Why this override exists (shown in the admin only)."))
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        abstract = True

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from ..conf import conf

        errors: dict[str, list[object]] = {}
        for name in QUOTA_MAXIMUMS | MONEY_MAXIMUMS:
            if getattr(self, name) is not None and getattr(self, f"unlimited_{name}"):
                errors.setdefault(name, []).append(
                    _("Give a number or tick “no limit”, not both.")
                )
        keys = self.model_keys()
        if keys is not None:
            known = set(conf.MODELS) if isinstance(conf.MODELS, dict) else set()
            unknown = [key for key in keys if key not in known]
            if unknown:
                errors.setdefault("allowed_models", []).append(
                    _("Not in CHATSTREAM_MODELS: %(keys)s (known: %(known)s).")
                    % {"keys": ", ".join(unknown), "known": ", ".join(sorted(known)) or "-"}
                )
            if self.all_models:
                errors.setdefault("allowed_models", []).append(
                    _("List models or tick “every model allowed”, not both.")
                )
        if errors:
            raise ValidationError(errors)

    def model_keys(self) -> list[str] | None:
        """The listed model keys, or None when the field is empty (inherit, or all)."""
        keys = [key.strip() for key in self.allowed_models.split(",") if key.strip()]
        return keys or None


class UserQuota(QuotaOverride):
    """One user's own limits: each field set here wins over their groups and the default."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chatstream_quota",
        verbose_name=_("user"),
    )

    class Meta:
        verbose_name = _("user quota")
        verbose_name_plural = _("user quotas")
        constraints = _override_constraints("chatstream_userquota")

    def __str__(self) -> str:
        return str(self.user)


class GroupQuota(QuotaOverride):
    """Limits for a group's members; a member of several gets the most generous of each."""

    group = models.OneToOneField(
        "auth.Group", on_delete=models.CASCADE, related_name="chatstream_quota",
        verbose_name=_("group"),
    )

    class Meta:
        verbose_name = _("group quota")
        verbose_name_plural = _("group quotas")
        constraints = _override_constraints("chatstream_groupquota")

    def __str__(self) -> str:
        return str(self.group)


class QuotaAccount(models.Model):
    """The per-user row every admission locks: it serialises one user's admissions."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True,
        related_name="chatstream_quota_account", verbose_name=_("user"),
    )
    admissions = models.PositiveBigIntegerField(_("admissions"), default=0)
    last_admitted_at = models.DateTimeField(_("last admission"), null=True, blank=True)

    class Meta:
        verbose_name = _("quota account")
        verbose_name_plural = _("quota accounts")

    def __str__(self) -> str:
        return str(self.user)


class QuotaCharge(models.Model):
    """One admitted request in the usage ledger: a hold until settled, then the charge.

    ``generation_id`` is a plain UUID, not a foreign key: deleting a conversation must not
    delete (or refund) what its replies cost.
    """

    class Source(models.TextChoices):
        PROVIDER = "provider", _("provider's usage")
        ESTIMATED = "estimated", _("estimate")
        RELEASED = "released", _("released (nothing generated)")
        RESERVATION = "reservation", _("whole reservation (outcome unknown)")

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chatstream_charges",
        verbose_name=_("user"),
    )
    generation_id = models.UUIDField(_("generation"), unique=True)
    model = models.CharField(_("model"), max_length=100)
    at = models.DateTimeField(_("admitted at"), help_text=_("Dates the usage: its period."))
    prompt_estimate = models.PositiveIntegerField(_("prompt estimate"))
    max_tokens = models.PositiveIntegerField(_("max tokens"))
    reserved = models.PositiveBigIntegerField(_("reserved tokens"))
    charged = models.PositiveBigIntegerField(
        _("charged tokens"), null=True, blank=True, help_text=_("Empty while the reply is live.")
    )
    source = models.CharField(_("charged at"), max_length=16, choices=Source.choices, blank=True)
    reserved_cost = _cost(_("reserved cost"),
                          _("The most the reply may cost, at the dearest model it may fall "
                            "back to. Empty: one of them has no price."))
    charged_cost = _cost(_("charged cost"), _("What the reply cost. Empty while the reply is "
                                              "live, or when it has no price."))
    settled_at = models.DateTimeField(_("settled at"), null=True, blank=True)

    class Meta:
        ordering = ["-at"]
        indexes = [
            models.Index(fields=["user", "at"], name="chatstream_charge_user_at"),
            models.Index(fields=["user"], name="chatstream_charge_open",
                         condition=models.Q(settled_at__isnull=True)),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(settled_at__isnull=True, charged__isnull=True)
                | models.Q(settled_at__isnull=False, charged__isnull=False),
                name="chatstream_charge_settled_has_charge",
            ),
        ]
        verbose_name = _("quota charge")
        verbose_name_plural = _("quota charges")

    def __str__(self) -> str:
        return f"{self.user} {self.at:%Y-%m-%d %H:%M:%S} {self.tokens}"

    @property
    def tokens(self) -> int:
        """What this row counts against the limits now: the charge, or the hold while live."""
        return self.reserved if self.charged is None else self.charged

    @property
    def is_open(self) -> bool:
        return self.settled_at is None

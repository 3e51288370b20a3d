"""Each upstream call a generation made (its attempts), and the models cooling down after
failing, shared by every worker process."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

# The attribute of a Generation object that holds its attempts, loaded (a prefetch's
# ``to_attr``, or the engine's own list at its final save): what the JSON API and the log line
# read of them without a query.
LOADED_ATTEMPTS = "loaded_attempts"


class Attempt(models.Model):
    """One upstream call of ``generation``: the first, a retry or a fallback.

    Every attempt but the last failed before its first content (that is what moves a reply on
    to its next attempt); the last is the one whose outcome is the generation's.
    """

    class Status(models.TextChoices):
        SUCCEEDED = "succeeded", pgettext_lazy("attempt status", "succeeded")
        FAILED = "failed", pgettext_lazy("attempt status", "failed")

    generation = models.ForeignKey(
        "Generation", on_delete=models.CASCADE, related_name="attempts",
        verbose_name=_("generation"),
    )
    number = models.PositiveSmallIntegerField(_("number"), help_text=_("1 for the first."))
    model = models.CharField(_("model"), max_length=100, help_text=_("Key in CHATSTREAM_MODELS."))
    status = models.CharField(_("status"), max_length=16, choices=Status.choices)
    http_status = models.PositiveSmallIntegerField(_("HTTP status"), null=True, blank=True)
    error_type = models.CharField(_("error type"), max_length=50, blank=True)
    retry_after = models.FloatField(
        _("retry after"), null=True, blank=True,
        help_text=_("Seconds the provider asked us to wait (its Retry-After)."))
    request_id = models.CharField(_("request id"), max_length=200, blank=True)
    started_at = models.DateTimeField(_("started"), default=timezone.now)
    first_token_at = models.DateTimeField(_("first token"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)

    class Meta:
        ordering = ["generation", "number"]
        constraints = [
            models.UniqueConstraint(fields=["generation", "number"],
                                    name="chatstream_attempt_number"),
        ]
        verbose_name = _("attempt")
        verbose_name_plural = _("attempts")

    def __str__(self) -> str:
        return str(_("Attempt %(number)s of %(generation)s") % {
            "number": self.number, "generation": str(self.generation_id)[:8]})


class Cooldown(models.Model):
    """A model that gets no traffic until ``until``, in any process (its circuit breaker)."""

    model = models.CharField(_("model"), max_length=100, primary_key=True,
                             help_text=_("Key in CHATSTREAM_MODELS."))
    until = models.DateTimeField(_("cooling down until"))
    error_type = models.CharField(_("why"), max_length=50, blank=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        verbose_name = _("model cooldown")
        verbose_name_plural = _("model cooldowns")

    def __str__(self) -> str:
        return self.model

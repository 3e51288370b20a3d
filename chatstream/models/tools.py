"""A tool call the model asked for: one row per call, from its arguments to its result."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy


class ToolCall(models.Model):
    """One call of a tool, asked for by the reply of ``generation`` (a step).

    Its ``id`` is the key a tool uses to make a side effect happen once: the provider's
    ``call_id`` may be empty, or repeated. A call that has started (``running`` and after)
    never runs again.
    """

    class Status(models.TextChoices):
        PENDING_APPROVAL = "pending_approval", pgettext_lazy("tool call status",
                                                             "waiting for approval")
        # may run, not started (no approval needed, too)
        APPROVED = "approved", pgettext_lazy("tool call status", "approved")
        DENIED = "denied", pgettext_lazy("tool call status", "declined")
        # undecided too long: declined
        EXPIRED = "expired", pgettext_lazy("tool call status", "expired")
        # stopped before it started
        CANCELLED = "cancelled", pgettext_lazy("tool call status", "cancelled")
        RUNNING = "running", pgettext_lazy("tool call status", "running")
        SUCCEEDED = "succeeded", pgettext_lazy("tool call status", "succeeded")
        FAILED = "failed", pgettext_lazy("tool call status", "failed")
        TIMED_OUT = "timed_out", pgettext_lazy("tool call status", "timed out")
        # its worker died while it ran: the outcome is unknown
        LOST = "lost", pgettext_lazy("tool call status", "lost")

    STARTED = (Status.RUNNING, Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT, Status.LOST)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    generation = models.ForeignKey(
        "Generation", on_delete=models.CASCADE, related_name="calls",
        verbose_name=_("generation"), help_text=_("The step whose reply asked for the call."),
    )
    position = models.PositiveSmallIntegerField(
        _("position"), help_text=_("Where the reply put the call among its calls, from 0."))
    call_id = models.CharField(_("provider's call id"), max_length=200, blank=True)
    name = models.CharField(_("tool"), max_length=200)
    arguments = models.TextField(_("arguments"), blank=True,
                                 help_text=_("The JSON text the model sent, as it sent it."))
    status = models.CharField(_("status"), max_length=16, choices=Status.choices)
    result = models.TextField(_("result"), blank=True,
                              help_text=_("The text the model was sent back."))
    error = models.TextField(_("error"), blank=True,
                             help_text=_("What went wrong, for staff (never sent to the model)."))
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
        related_name="+", verbose_name=_("decided by"),
    )
    decided_at = models.DateTimeField(_("decided"), null=True, blank=True)
    created_at = models.DateTimeField(_("created"), default=timezone.now, editable=False)
    started_at = models.DateTimeField(_("started"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)

    class Meta:
        ordering = ["generation", "position"]
        constraints = [
            models.UniqueConstraint(fields=["generation", "position"],
                                    name="chatstream_toolcall_position"),
        ]
        indexes = [models.Index(fields=["status", "created_at"],
                                name="chatstream_toolcall_status")]
        verbose_name = _("tool call")
        verbose_name_plural = _("tool calls")

    def __str__(self) -> str:
        # Its id alone: the arguments may hold the user's words, and the name is the model's
        # (a name it made up could too).
        return str(_("Tool call %(id)s") % {"id": str(self.pk)[:8]})

    @property
    def has_started(self) -> bool:
        return self.status in self.STARTED

"""Chat records: conversations, their messages, and each upstream attempt (a generation)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy


class Conversation(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="chatstream_conversations",
        verbose_name=_("user"),
    )
    title = models.CharField(_("title"), max_length=200, blank=True)
    model = models.CharField(
        _("model"), max_length=100, blank=True, help_text=_("Key in CHATSTREAM_MODELS.")
    )
    created_at = models.DateTimeField(_("created"), default=timezone.now, editable=False)
    updated_at = models.DateTimeField(_("last activity"), default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["user", "-updated_at"], name="chatstream_conv_user_upd")]
        verbose_name = _("conversation")
        verbose_name_plural = _("conversations")

    def __str__(self) -> str:
        # Never the title: it is the start of the user's first message, and str() goes where no
        # permission is checked (the admin's autocomplete and delete pages, LogEntry rows).
        return str(_("Conversation %(id)s") % {"id": str(self.pk)[:8]})

    def get_absolute_url(self) -> str:
        return reverse("chatstream:conversation-detail", kwargs={"pk": self.pk})


class Message(models.Model):
    class Role(models.TextChoices):
        SYSTEM = "system", pgettext_lazy("message role", "system")
        USER = "user", pgettext_lazy("message role", "user")
        ASSISTANT = "assistant", pgettext_lazy("message role", "assistant")
        TOOL = "tool", pgettext_lazy("message role", "tool")

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    role = models.CharField(_("role"), max_length=16, choices=Role.choices)
    content = models.TextField(_("content"), blank=True)
    created_at = models.DateTimeField(_("created"), default=timezone.now, editable=False)
    generation = models.OneToOneField(
        "Generation",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="reply",
        help_text=_("For an assistant message: the generation that wrote it."),
    )
    edit_of = models.ForeignKey(
        "self",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="edits",
        verbose_name=_("edit of"),
        help_text=_("For a user message sent by editing an earlier one: the version it "
                    "replaces. The earlier version and its replies are kept."),
    )

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name = _("message")
        verbose_name_plural = _("messages")

    def __str__(self) -> str:
        # Never the text, as for Conversation.
        return str(_("Message %(id)s (%(role)s)") % {"id": self.pk,
                                                     "role": self.get_role_display()})


class Generation(models.Model):
    """One upstream attempt: a record, kept on every outcome."""

    class Status(models.TextChoices):
        PENDING = "pending", pgettext_lazy("generation status", "pending")
        STREAMING = "streaming", pgettext_lazy("generation status", "streaming")
        COMPLETED = "completed", pgettext_lazy("generation status", "completed")
        CANCELLED = "cancelled", pgettext_lazy("generation status", "cancelled")
        INTERRUPTED = "interrupted", pgettext_lazy("generation status", "interrupted")
        FAILED = "failed", pgettext_lazy("generation status", "failed")

    class UsageSource(models.TextChoices):
        PROVIDER = "provider", pgettext_lazy("usage source", "provider")
        ESTIMATED = "estimated", pgettext_lazy("usage source", "estimated")
        NONE = "none", pgettext_lazy("usage source", "none")

    LIVE = (Status.PENDING, Status.STREAMING)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="generations"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="chatstream_generations",
        verbose_name=_("user"),
    )
    prompt_message = models.ForeignKey(
        Message,
        on_delete=models.CASCADE,
        related_name="generations",
        help_text=_("The user message this generation answers."),
    )
    retry_of = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="retries"
    )
    step = models.PositiveSmallIntegerField(
        _("step"), default=1,
        help_text=_("1 for the reply to the user's message; each upstream call that carries "
                    "the results of the previous one's tool calls is the next step."),
    )
    follows = models.ForeignKey(
        "self", on_delete=models.CASCADE, null=True, blank=True, related_name="followed_by",
        verbose_name=_("follows"),
        help_text=_("The previous step, whose tool calls this one answers."),
    )
    waits_for_tools = models.BooleanField(
        _("waits for tools"), default=False,
        help_text=_("The previous step's tool calls have not all ended: this step may not "
                    "start yet."),
    )
    request_id = models.CharField(_("request id"), max_length=200, blank=True, db_index=True)
    model = models.CharField(_("model"), max_length=100, help_text=_("Key in CHATSTREAM_MODELS."))
    provider_model = models.CharField(_("provider model"), max_length=200, blank=True)
    status = models.CharField(
        _("status"), max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True
    )
    reason = models.CharField(
        _("reason"), max_length=200, blank=True, help_text=_("Why it ended as it did.")
    )
    content = models.TextField(_("content"), blank=True)
    content_html = models.TextField(
        _("content as HTML"), blank=True, editable=False,
        help_text=_("The text rendered and sanitised at the final save, served while its key "
                    "matches the renderer's."),
    )
    content_html_key = models.CharField(
        _("rendering key"), max_length=64, blank=True, editable=False,
        help_text=_("What the HTML was rendered with (the renderer, its libraries, the link "
                    "and image settings); another key renders the text again."),
    )
    reasoning = models.TextField(
        _("reasoning"), blank=True,
        help_text=_("What a reasoning model wrote before its reply (its thinking)."),
    )
    finish_reason = models.CharField(_("finish reason"), max_length=40, blank=True)
    tool_calls = models.JSONField(_("tool calls"), default=list, blank=True)
    upstream_messages = models.JSONField(
        _("messages sent upstream"), default=list, blank=True,
        help_text=_("The system prompt and conversation sent to the provider, fixed when the "
                    "generation was created."),
    )
    upstream_params = models.JSONField(
        _("request fields sent upstream"), default=dict, blank=True,
        help_text=_("Extra request fields a request hook set (temperature...), on top of the "
                    "model's."),
    )
    created_at = models.DateTimeField(_("created"), default=timezone.now, db_index=True)
    started_at = models.DateTimeField(_("started"), null=True, blank=True)
    first_token_at = models.DateTimeField(_("first token"), null=True, blank=True)
    completed_at = models.DateTimeField(_("completed"), null=True, blank=True)
    heartbeat_at = models.DateTimeField(_("heartbeat"), null=True, blank=True)
    watched_at = models.DateTimeField(
        _("last watched"), null=True, blank=True,
        help_text=_("When a page last showed this generation while it streamed."),
    )
    worker = models.CharField(
        _("worker"), max_length=100, blank=True,
        help_text=_("host:pid of the process that streamed it."),
    )
    prompt_tokens = models.PositiveIntegerField(_("prompt tokens"), null=True, blank=True)
    cached_tokens = models.PositiveIntegerField(_("cached tokens"), null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(_("completion tokens"), null=True, blank=True)
    reasoning_tokens = models.PositiveIntegerField(
        _("reasoning tokens"), null=True, blank=True,
        help_text=_("Of the completion tokens, those spent thinking, when the provider says."),
    )
    usage_source = models.CharField(
        _("usage source"), max_length=16, choices=UsageSource.choices, default=UsageSource.NONE
    )
    http_status = models.PositiveSmallIntegerField(_("HTTP status"), null=True, blank=True)
    error_type = models.CharField(_("error type"), max_length=50, blank=True, db_index=True)
    cancel_requested = models.BooleanField(_("stop requested"), default=False)
    answered_by = models.CharField(
        _("answered by"), max_length=100, blank=True,
        help_text=_("Key in CHATSTREAM_MODELS of the model whose call gave the reply: a "
                    "fallback's when it stood in for the model asked."),
    )
    fallbacks = models.JSONField(
        _("fallbacks"), default=list, blank=True,
        help_text=_("The models (keys) this reply may fall back to, in order, as chosen when it "
                    "was sent: those the user may use, with the same tools."),
    )
    cost = models.DecimalField(
        _("cost"), max_digits=20, decimal_places=10, null=True, blank=True,
        help_text=_("What its usage cost at the prices in force at its final save; never "
                    "changed after."),
    )
    currency = models.CharField(_("currency"), max_length=3, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["user", "-created_at"], name="chatstream_gen_user_created"),
            models.Index(fields=["status", "heartbeat_at"], name="chatstream_gen_status_hb"),
        ]
        permissions = [
            ("view_generation_content", _("Can read the text of users' conversations")),
        ]
        verbose_name = _("generation")
        verbose_name_plural = _("generations")

    def __str__(self) -> str:
        return f"{self.model} {self.status} {self.id}"

    @property
    def is_live(self) -> bool:
        return self.status in self.LIVE

    @property
    def time_to_first_token(self) -> timedelta | None:
        if self.started_at and self.first_token_at:
            return self.first_token_at - self.started_at
        return None

    @property
    def duration(self) -> timedelta | None:
        if self.started_at and self.completed_at:
            return self.completed_at - self.started_at
        return None

from __future__ import annotations

from django.conf import settings
from django.db import models


class FaqEntry(models.Model):
    """A question the site answers the same way every time: sent with every request."""

    question = models.CharField(max_length=200)
    answer = models.TextField()
    position = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["position", "pk"]

    def __str__(self) -> str:
        return self.question


class UsageCharge(models.Model):
    """One finished reply, billed: at most one row per generation, whatever is sent twice."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    generation_id = models.UUIDField(unique=True)
    model = models.CharField(max_length=100)
    status = models.CharField(max_length=20)
    prompt_tokens = models.PositiveIntegerField(null=True)
    completion_tokens = models.PositiveIntegerField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.user} {self.generation_id} {self.status}"

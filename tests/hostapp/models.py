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


class Order(models.Model):
    """One of a customer's orders, which the shop's tools look up and refund."""

    class Status(models.TextChoices):
        PAID = "paid"
        SHIPPED = "shipped"
        DELIVERED = "delivered"

    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PAID)
    total_cents = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"Order {self.pk}"


class Refund(models.Model):
    """A refund the assistant made, with the user's approval: one per tool call at most (the
    call's id is its key), whatever happens to the call after it ran."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="refunds")
    tool_call_id = models.UUIDField(unique=True)
    reason = models.CharField(max_length=20)
    cents = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"Refund of order {self.order_id}"

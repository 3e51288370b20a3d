"""What users say of the replies they were given: a thumbs up or down, and a comment."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from .chat import Generation

COMMENT_LENGTH = 2000


class Feedback(models.Model):
    """One user's rating of one reply; changed in place when they change their mind."""

    class Rating(models.IntegerChoices):
        GOOD = 1, pgettext_lazy("feedback rating", "good")
        BAD = -1, pgettext_lazy("feedback rating", "bad")

    generation = models.ForeignKey(
        Generation, on_delete=models.CASCADE, related_name="feedback",
        verbose_name=_("generation"),
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
        related_name="chatstream_feedback", verbose_name=_("user"),
    )
    rating = models.SmallIntegerField(_("rating"), choices=Rating.choices)
    comment = models.TextField(_("comment"), blank=True, max_length=COMMENT_LENGTH)
    created_at = models.DateTimeField(_("created"), default=timezone.now, editable=False)
    updated_at = models.DateTimeField(_("updated"), default=timezone.now)

    class Meta:
        ordering = ["-updated_at"]
        constraints = [
            models.UniqueConstraint(fields=["generation", "user"],
                                    name="chatstream_feedback_once_per_user"),
        ]
        verbose_name = _("feedback")
        verbose_name_plural = _("feedback")

    def __str__(self) -> str:
        # Never the comment: str() goes where no permission is checked.
        return str(_("Feedback %(id)s (%(rating)s)") % {"id": self.pk,
                                                        "rating": self.get_rating_display()})

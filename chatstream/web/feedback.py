"""What users say of their replies: a thumbs up or down, then an optional comment.

Only the user a reply was written for rates it, and only once it has ended. Each thumb says
what pressing it leads to: the one not pressed sends its rating, the pressed one sends none,
which takes the rating (and its comment) back. A request names the state wanted, never
"toggle", so a page showing an old state cannot flip a rating the wrong way. Changing the
thumb keeps the comment; a request without a ``comment`` field leaves it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django import forms
from django.db.models import OuterRef, QuerySet, Subquery
from django.utils import timezone
from django.utils.translation import gettext_lazy

from ..models import Feedback, Generation
from ..models.feedback import COMMENT_LENGTH

TEMPLATE = "chatstream/includes/feedback.html"
# A rating as requests name it; "" (or JSON null) is no rating.
RATINGS: dict[str, int] = {"good": Feedback.Rating.GOOD, "bad": Feedback.Rating.BAD}
NAMES: dict[int | None, str] = {value: name for name, value in RATINGS.items()}
STILL_LIVE = gettext_lazy("This reply is still being written: rate it once it has ended.")


class FeedbackForm(forms.Form):
    """A rating (good, bad, or none to take it back) and, optionally, a comment."""

    rating = forms.ChoiceField(required=False, choices=[
        ("", "-"), ("good", gettext_lazy("Good reply")), ("bad", gettext_lazy("Bad reply"))])
    comment = forms.CharField(
        label=gettext_lazy("Comment"), required=False, strip=True, max_length=COMMENT_LENGTH,
        error_messages={"max_length": gettext_lazy(
            "A comment can be at most %(limit_value)d characters long (this one has "
            "%(show_value)d). Shorten it, then save it again.")},
    )


@dataclass(frozen=True)
class FeedbackState:
    """What one reply's feedback controls show."""

    rating: int | None = None
    comment: str = ""
    said: str = ""  # what the last request did, announced politely
    error: str = ""  # why a comment was refused
    comment_open: bool = False
    comment_length: int = COMMENT_LENGTH

    @property
    def good(self) -> bool:
        return self.rating == Feedback.Rating.GOOD

    @property
    def bad(self) -> bool:
        return self.rating == Feedback.Rating.BAD

    @property
    def name(self) -> str:
        """The rating as requests name it: "good", "bad", or "" for none."""
        return NAMES.get(self.rating, "")


def owner_feedback(field: str) -> Subquery:
    """``field`` of the generation's feedback by its own user (the one shown and counted),
    for an annotation of a generation queryset; NULL when unrated."""
    mine = Feedback.objects.filter(generation=OuterRef("pk"), user=OuterRef("user_id"))
    return Subquery(mine.values(field)[:1])


def with_feedback(queryset: QuerySet[Generation]) -> QuerySet[Generation]:
    """``queryset`` with each generation's rating and comment by its user, in the same query
    (``feedback_rating``, ``feedback_comment``): the page reads them per reply."""
    return queryset.annotate(feedback_rating=owner_feedback("rating"),
                             feedback_comment=owner_feedback("comment"))


def state_of(generation: Generation, **shown: Any) -> FeedbackState:
    """The feedback of ``generation`` as read with it (:func:`with_feedback`); unrated when it
    was not, as for a reply that just ended: a template never queries per reply."""
    return FeedbackState(rating=getattr(generation, "feedback_rating", None),
                         comment=getattr(generation, "feedback_comment", None) or "", **shown)


def rate(generation: Generation, *, rating: int | None, comment: str | None = None
         ) -> Feedback | None:
    """Store the owner's rating of ``generation``: None takes it back, with its comment; a
    ``comment`` of None keeps the one stored. The caller checks the reply has ended."""
    if rating is None:
        Feedback.objects.filter(generation=generation, user_id=generation.user_id).delete()
        return None
    fields: dict[str, Any] = {"rating": rating, "updated_at": timezone.now()}
    if comment is not None:
        fields["comment"] = comment
    feedback, _created = Feedback.objects.update_or_create(
        generation=generation, user_id=generation.user_id, defaults=fields)
    return feedback

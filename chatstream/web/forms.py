from __future__ import annotations

from typing import Any, cast

from django import forms
from django.core.validators import MaxLengthValidator
from django.utils.translation import gettext_lazy as _

from ..conf import ModelChoice, conf
from ..domain import access, search


class MessageForm(forms.Form):
    """A user's message; the model must be on the server's allow-list."""

    content = forms.CharField(label=_("Message"), strip=True, widget=forms.Textarea(attrs={
        "rows": 2, "autocomplete": "off", "required": True, "enterkeyhint": "send",
        "aria-describedby": "cs-composer-hint", "placeholder": _("Ask anything…"),
    }))
    model = forms.ChoiceField(label=_("Model"), required=False, error_messages={
        "invalid_choice": _("This model is not available."),
    })

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        # The declared fields above, copied per form: set from the live settings.
        content = cast(forms.CharField, self.fields["content"])
        content.max_length = conf.MAX_MESSAGE_LENGTH
        content.validators.append(MaxLengthValidator(conf.MAX_MESSAGE_LENGTH))
        content.widget.attrs["maxlength"] = conf.MAX_MESSAGE_LENGTH
        model = cast(forms.ChoiceField, self.fields["model"])
        model.choices = [(c.key, c.label) for c in self.models()]

    def models(self) -> list[ModelChoice]:
        """The models this form offers: the user's (see access.py), or every allow-listed one."""
        return conf.model_choices() if self.user is None else access.models_for(self.user)

    def clean_model(self) -> str:
        key = self.cleaned_data.get("model") or None
        choice = (conf.get_model(key) if self.user is None
                  else access.model_for(self.user, key))
        if choice is None:
            raise forms.ValidationError(_("This model is not available."), code="model")
        return choice.key


class ConversationForm(forms.Form):
    """Rename a conversation; an empty title brings back the one taken from its first message."""

    title = forms.CharField(label=_("Title"), max_length=200, required=False, strip=True,
                            widget=forms.TextInput(attrs={
                                "autocomplete": "off", "aria-describedby": "cs-rename-hint",
                            }))


class EditForm(forms.Form):
    """The last message, edited, to be sent again (its model is the conversation's)."""

    content = forms.CharField(label=_("Edit your message"), strip=True,
                              widget=forms.Textarea(attrs={"rows": 3, "autocomplete": "off",
                                                           "required": True}))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        content = cast(forms.CharField, self.fields["content"])
        content.max_length = conf.MAX_MESSAGE_LENGTH
        content.validators.append(MaxLengthValidator(conf.MAX_MESSAGE_LENGTH))
        content.widget.attrs["maxlength"] = conf.MAX_MESSAGE_LENGTH


class SearchForm(forms.Form):
    """A search of the user's conversations (domain/search.py reads the query)."""

    q = forms.CharField(
        label=_("Search your conversations"), required=False, strip=True,
        max_length=search.MAX_QUERY_LENGTH,
        error_messages={"max_length": _("Search for at most %(limit_value)d characters "
                                        "(this has %(show_value)d).")})

from __future__ import annotations

from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from .conf import conf


class MessageForm(forms.Form):
    """A user's message; the model must be on the server's allow-list."""

    content = forms.CharField(label=_("Message"), strip=True, widget=forms.Textarea(attrs={
        "rows": 3, "autocomplete": "off", "required": True,
    }))
    model = forms.ChoiceField(label=_("Model"), required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["content"].max_length = conf.MAX_MESSAGE_LENGTH
        self.fields["content"].validators.append(
            forms.CharField(max_length=conf.MAX_MESSAGE_LENGTH).validators[-1]
        )
        self.fields["content"].widget.attrs["maxlength"] = conf.MAX_MESSAGE_LENGTH
        self.fields["model"].choices = [(c.key, c.label) for c in conf.model_choices()]

    def clean_content(self) -> str:
        content: str = self.cleaned_data["content"]
        if "\x00" in content:
            raise forms.ValidationError(_("The message contains a NUL character."), code="nul")
        return content

    def clean_model(self) -> str:
        choice = conf.get_model(self.cleaned_data.get("model") or None)
        if choice is None:
            raise forms.ValidationError(_("This model is not available."), code="model")
        return choice.key


class ConversationForm(forms.Form):
    title = forms.CharField(label=_("Title"), max_length=200, required=False, strip=True)

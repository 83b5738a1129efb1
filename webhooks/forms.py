from __future__ import annotations

from django import forms
from django.core.validators import URLValidator

from webhooks.models import EventType


class EndpointForm(forms.Form):
    url = forms.URLField(
        max_length=500,
        assume_scheme="https",
        label="Address",
        help_text="Where events are posted: an http:// or https:// URL.",
        # Not ftp:// (URLField's default allows it): events are posted over HTTP.
        validators=[URLValidator(schemes=["http", "https"])],
    )
    description = forms.CharField(max_length=200, required=False)
    events = forms.MultipleChoiceField(
        choices=EventType.choices,
        widget=forms.CheckboxSelectMultiple,
        error_messages={"required": "Choose at least one event type."},
    )

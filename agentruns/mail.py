"""The one way an agent's tool sends an email: Django's mail, as one tenant's mail account.

SMTP offers no idempotency key and no lookup, so a tool built on this declares
``MANUAL`` recovery: an interrupted send is never sent again by itself; a person
settles it. The effect key travels in a header and in the Message-ID (the same on
every attempt of one effect), so that person can find the message in the mail log.
"""

from __future__ import annotations

import hashlib
import smtplib

from django.core.mail import EmailMessage, get_connection

from agentruns.runtime import CallInfo, ProviderBusy, ToolRefused


def message_id(effect_key: str) -> str:
    """The Message-ID of every attempt of one effect."""
    return f"<{hashlib.sha256(effect_key.encode()).hexdigest()[:32]}@holdfast.effect>"


def email_send(call: CallInfo, *, to: str, subject: str, body: str) -> dict:
    """Send one message with the run's tenant's mail account; the tool's answer."""
    account = call.credentials("mail")
    key = call.effect_key or call.step_id
    message = EmailMessage(
        from_email=account.sender,
        subject=subject,
        body=body,
        to=[to],
        headers={"X-Holdfast-Effect-Key": call.effect_key or "", "Message-ID": message_id(key)},
        connection=get_connection(timeout=call.timeout),
    )
    try:
        message.send()
    except ConnectionRefusedError as error:
        # Nothing reached the server: not sent, try later.
        raise ProviderBusy(f"mail server unreachable: {error}", error_class="unreachable") from None
    except smtplib.SMTPRecipientsRefused as error:
        raise ToolRefused(f"recipient refused: {error}", error_class="invalid_request") from None
    return {"to": to, "subject": subject, "accepted": True}

"""The notify agents' tools, declared with what their providers offer.

- ``notice_facts`` and ``digest_facts`` read Holdfast's own tables (read-only): the
  recorded answer is what the run sends, so a replay sends the same words to the
  same people;
- ``send_email`` is the support agent's mail path (``agentruns.mail``): Django's
  mail to the tenant's mail account, the effect key in a header and in the
  Message-ID. SMTP offers no idempotency key and no lookup, so it is ``MANUAL``:
  an interrupted send is never sent blindly again; it becomes a case for a person;
- ``hold_for_digest`` writes the digest entry under the step's effect key (unique):
  a resend finds the row, and a lookup reads it;
- ``post_webhook`` posts a Slack-compatible message with ``Idempotency-Key`` = the
  effect key; the receiver delivers one message per key and answers a lookup by
  key, so a send interrupted by a crash is settled by lookup or by a resend that
  delivers nothing new.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import urllib.parse
from datetime import timedelta
from typing import Literal

import requests
import urllib3
from django.db import IntegrityError, transaction
from pydantic import BaseModel, Field

from agentruns.mail import email_send
from agentruns.runtime import (
    MANUAL,
    READ_ONLY,
    CallInfo,
    LookupResult,
    ProviderBusy,
    ToolRefused,
    idempotent,
    tool,
)
from notifications.models import DigestEntry
from notifications.notices import digest_listing, event_facts

# The receiver keeps one delivery per key for as long as it keeps deliveries.
WEBHOOK_KEY_WINDOW = timedelta(hours=24)
# Our own table: the unique effect key holds for as long as the row exists.
DIGEST_KEY_WINDOW = timedelta(days=365)


class NoticeFactsArgs(BaseModel):
    kind: Literal["approval", "case"]
    object_id: int = Field(gt=0)


@tool(
    name="notice_facts",
    args=NoticeFactsArgs,
    description="Read what a notification says and who may act on it, now.",
    recovery=READ_ONLY,
    timeout=5.0,
    provider="holdfast",
)
def notice_facts(request: dict, call: CallInfo) -> dict:
    if call.tenant_id is None:
        raise ToolRefused("a notification belongs to a tenant", error_class="invalid_request")
    facts = event_facts(request["kind"], request["object_id"], tenant_id=call.tenant_id)
    try:
        # A tenant with no webhook account, or one without an address, has none.
        facts["webhook"] = bool(call.credentials("webhook").endpoint)
    except ToolRefused:
        facts["webhook"] = False
    return facts


class EmailArgs(BaseModel):
    to: str = Field(pattern=r"^[^@\s]+@[^@\s]+$")
    subject: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1, max_length=20_000)


@tool(
    name="send_email",
    args=EmailArgs,
    description="Email an operator. Cannot be undone or checked afterwards.",
    # SMTP has no idempotency key and no lookup: only a person can tell whether an
    # interrupted send went out (as the support agent's send_customer_email).
    recovery=MANUAL,
    timeout=10.0,
    provider="mail (SMTP)",
)
def send_email(request: dict, call: CallInfo) -> dict:
    return email_send(call, to=request["to"], subject=request["subject"], body=request["body"])


class DigestHoldArgs(BaseModel):
    user_id: int = Field(gt=0)
    subject: str = Field(min_length=1, max_length=200)
    summary: str = Field(min_length=1, max_length=20_000)
    link: str = Field(min_length=1, max_length=500)


def _entry_json(entry: DigestEntry) -> dict:
    return {"entry": entry.pk, "user_id": entry.user_id, "held": True}


def _find_entry(request: dict, call: CallInfo) -> LookupResult:
    entry = DigestEntry.objects.filter(effect_key=call.effect_key).first()
    if entry is None:
        return LookupResult("absent", conclusive=True, detail="no digest entry has this key")
    return LookupResult("found", _entry_json(entry), conclusive=True)


@tool(
    name="hold_for_digest",
    args=DigestHoldArgs,
    description="Keep a notice for the operator's next digest.",
    recovery=idempotent(DIGEST_KEY_WINDOW, lookup=True),
    lookup=_find_entry,
    timeout=5.0,
    provider="holdfast",
)
def hold_for_digest(request: dict, call: CallInfo) -> dict:
    if call.tenant_id is None or not call.effect_key:
        raise ToolRefused("a digest entry needs a tenant and an effect key")
    try:
        with transaction.atomic():
            entry, _ = DigestEntry.objects.get_or_create(
                effect_key=call.effect_key,
                defaults={
                    "tenant_id": call.tenant_id,
                    "user_id": request["user_id"],
                    "subject": request["subject"],
                    "summary": request["summary"],
                    "link": request["link"],
                },
            )
    except IntegrityError:
        entry = DigestEntry.objects.get(effect_key=call.effect_key)
    return _entry_json(entry)


class WebhookArgs(BaseModel):
    title: str = Field(min_length=1, max_length=200)
    text: str = Field(min_length=1, max_length=20_000)
    link: str = Field(min_length=1, max_length=500)


def slack_message(args: dict, config: dict) -> dict:
    """The body as a Slack incoming webhook takes it: ``text`` for notifications and
    clients without blocks, ``blocks`` for the rest; a button that opens the card."""
    return {
        "text": f"{args['title']}: {args['link']}",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": args["title"][:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": args["text"][:3000]}},
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": "Open the card"},
                        "url": args["link"],
                    }
                ],
            },
        ],
    }


def webhook_body(value: dict) -> bytes:
    """The bytes a webhook posts: canonical JSON, the same bytes on every resend (the
    receiver compares nothing, but a signature does). Shared with ``webhooks``."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def retry_after_seconds(answer: requests.Response) -> float | None:
    """A 429's or 503's ``Retry-After`` in seconds (the delay form), or None."""
    try:
        seconds = float(answer.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _find_delivery(request: dict, call: CallInfo) -> LookupResult:
    account = call.credentials("webhook")
    key = urllib.parse.quote(call.effect_key or "", safe="")
    url = f"{account.endpoint.rstrip('/')}/deliveries/{key}"
    answer = requests.get(url, timeout=call.timeout)
    if answer.status_code == 404:
        # The receiver's listing by key is complete: no row, no delivery.
        return LookupResult("absent", conclusive=True, detail="no delivery under this key")
    if answer.status_code == 200:
        return LookupResult("found", answer.json(), conclusive=True)
    return LookupResult("inconclusive", detail=f"the receiver answered {answer.status_code}")


@tool(
    name="post_webhook",
    args=WebhookArgs,
    description="Post the notice to the tenant's chat webhook.",
    recovery=idempotent(WEBHOOK_KEY_WINDOW, lookup=True),
    request=slack_message,
    lookup=_find_delivery,
    timeout=10.0,
    provider="webhook",
)
def post_webhook(request: dict, call: CallInfo) -> dict:
    account = call.credentials("webhook")
    if not account.endpoint.startswith(("https://", "http://")):
        raise ToolRefused(
            "the webhook address must be an http(s) URL", error_class="invalid_request"
        )
    body = webhook_body(request)
    headers = {"Content-Type": "application/json", "Idempotency-Key": call.effect_key or ""}
    if account.secret:
        digest = hmac.new(account.secret.encode(), body, hashlib.sha256).hexdigest()
        headers["X-Holdfast-Signature"] = f"sha256={digest}"
    try:
        answer = requests.post(account.endpoint, data=body, headers=headers, timeout=call.timeout)
    except requests.exceptions.ConnectionError as error:
        if isinstance(error, requests.exceptions.ConnectTimeout) or never_connected(error):
            raise ProviderBusy(
                f"the webhook is unreachable: {error}", error_class="unreachable"
            ) from None
        raise
    if answer.status_code == 429:
        raise ProviderBusy("the webhook is rate limiting", retry_after=retry_after_seconds(answer))
    if 400 <= answer.status_code < 500:
        raise ToolRefused(
            f"the webhook refused the message ({answer.status_code})",
            error_class="invalid_request",
            status=answer.status_code,
        )
    answer.raise_for_status()
    try:
        reply = answer.json()
    except ValueError:
        # Slack itself answers a plain "ok": delivered all the same.
        reply = {}
    if not isinstance(reply, dict):
        reply = {}
    return {
        "delivered": True,
        "delivery": reply.get("delivery"),
        "replayed": bool(reply.get("replayed")),
    }


def never_connected(error: requests.exceptions.ConnectionError) -> bool:
    """Refused or unreachable before a byte was sent. Shared with ``webhooks``."""
    reason = getattr(error.args[0], "reason", None) if error.args else None
    return isinstance(reason, urllib3.exceptions.NewConnectionError)


class DigestFactsArgs(BaseModel):
    user_id: int = Field(gt=0)
    digest_request: str = Field(min_length=1, max_length=200)


@tool(
    name="digest_facts",
    args=DigestFactsArgs,
    description="Read what waits in an operator's digest, and where to send it.",
    recovery=READ_ONLY,
    timeout=5.0,
    provider="holdfast",
)
def digest_facts(request: dict, call: CallInfo) -> dict:
    return digest_listing(request["user_id"], request["digest_request"], tenant_id=call.tenant_id)

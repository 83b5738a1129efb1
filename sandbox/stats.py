"""Effect counts from the sandbox's own tables: the provider's view, never the caller's logs."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.db.models import Count, Sum

from sandbox.models import DB, Fault, IdempotencyRecord, MailMessage, Refund
from sandbox.webhooks import delivery_stats


def effect_stats() -> dict[str, Any]:
    refunds = Refund.objects.using(DB)
    per_intent = refunds.values("payment_intent_id").annotate(
        count=Count("id"), amount=Sum("amount")
    )
    per_account = refunds.values("payment_intent__account").annotate(
        count=Count("id"), amount=Sum("amount")
    )
    per_key = (
        refunds.exclude(idempotency_key="").values("idempotency_key").annotate(count=Count("id"))
    )
    recipients: Counter[str] = Counter()
    messages = 0
    for rcpt_tos in MailMessage.objects.using(DB).values_list("rcpt_tos", flat=True):
        messages += 1
        recipients.update(address.lower() for address in rcpt_tos)
    return {
        "refunds": {
            "total": refunds.count(),
            "amount": refunds.aggregate(total=Sum("amount"))["total"] or 0,
            "by_payment_intent": {
                row["payment_intent_id"]: {"count": row["count"], "amount": row["amount"]}
                for row in per_intent.order_by("payment_intent_id")
            },
            "by_idempotency_key": {
                row["idempotency_key"]: row["count"] for row in per_key.order_by("idempotency_key")
            },
            "by_account": {
                row["payment_intent__account"]: {"count": row["count"], "amount": row["amount"]}
                for row in per_account.order_by("payment_intent__account")
            },
        },
        "messages": {"total": messages, "by_recipient": dict(sorted(recipients.items()))},
        "webhooks": delivery_stats(),
        "idempotency_records": IdempotencyRecord.objects.using(DB).count(),
        "faults_armed": Fault.objects.using(DB).filter(remaining__gt=0).count(),
    }


def recent_messages(limit: int = 100) -> list[dict[str, Any]]:
    """The mail sink's latest messages, newest first."""
    messages = MailMessage.objects.using(DB).order_by("-received_at", "-id")[:limit]
    return [
        {
            "id": message.pk,
            "mail_from": message.mail_from,
            "rcpt_tos": message.rcpt_tos,
            "subject": message.subject,
            "message_id": message.message_id,
            "body": message.body,
            "received_at": message.received_at.isoformat(),
        }
        for message in messages
    ]

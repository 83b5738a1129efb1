"""What a notification says, and to whom: read when the notify run asks, never before.

One rule for the words: the exact action, the amount in its currency, a link to the
card's page, all through the masking rule (``accounts.privacy``). Never a token and
never a link that acts by itself: the link opens the page, where sign-in, the
approver's authority and CSRF apply as for anyone who typed the address.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.urls import reverse

from accounts.privacy import mask_text
from accounts.services import user_actor_name
from agentruns.money import format_amount
from approvals.models import Approval, ApprovalStatus
from approvals.policy import approver_problem
from notifications.models import Delivery, DigestEntry, NotificationPreference
from reconciliation.models import CaseStatus, ReconciliationCase

SETTLE_PERMISSION = "accounts.settle_effects"


@dataclass(frozen=True)
class Notice:
    subject: str
    text: str
    link: str


def card_link(name: str, pk: int) -> str:
    return settings.HOLDFAST_BASE_URL.rstrip("/") + reverse(name, args=[pk])


def approval_notice(approval: Approval) -> Notice:
    money = format_amount(approval.amount, approval.currency) if approval.amount else ""
    link = card_link("approval-detail", approval.pk)
    lines = [
        f"An approval waits in {approval.tenant}.",
        "",
        f"Action: {approval.tool}: {approval.preview}",
    ]
    if money:
        lines.append(f"Amount: {money}")
    lines += [
        f"Requested by: {approval.requested_by or 'a run'}",
        f"Expires: {approval.expires_at:%Y-%m-%d %H:%M} UTC",
        "",
        f"Open the card to decide: {link}",
        "(The link opens the approval's page; deciding needs you signed in.)",
    ]
    subject = f"Approval needed: {approval.tool}" + (f", {money}" if money else "")
    return Notice(mask_text(subject), mask_text("\n".join(lines)), link)


def case_notice(case: ReconciliationCase) -> Notice:
    money = format_amount(case.amount, case.currency) if case.amount else ""
    link = card_link("case-detail", case.pk)
    lines = [
        f"A case opened in {case.tenant}: nobody can tell whether an effect happened.",
        "",
        f"Action: {case.tool} (step {case.step_id_label}, provider {case.provider or '—'})",
    ]
    if money:
        lines.append(f"Amount: {money}")
    lines += [
        f"Why: {case.reason}",
        "",
        f"Open the card to settle it: {link}",
        "(The link opens the case's page; settling needs you signed in.)",
    ]
    subject = f"Case opened: {case.tool}" + (f", {money}" if money else "")
    return Notice(mask_text(subject), mask_text("\n".join(lines)), link)


def _deliveries(users) -> dict[int, str]:
    chosen = dict(
        NotificationPreference.objects.filter(user__in=users).values_list("user_id", "delivery")
    )
    return {user.pk: chosen.get(user.pk, Delivery.IMMEDIATE) for user in users}


def _recipients(users) -> list[dict]:
    users = list(users)
    deliveries = _deliveries(users)
    return [
        {"user_id": user.pk, "to": user.email, "delivery": deliveries[user.pk]}
        for user in sorted(users, key=lambda u: u.pk)
        if deliveries[user.pk] != Delivery.OFF
    ]


def _operators(tenant_id: int):
    # Active operators of that tenant only, each with an address to write to.
    return (
        get_user_model()
        .objects.filter(is_active=True, operator__tenant_id=tenant_id)
        .exclude(email="")
        .select_related("operator__tenant")
    )


def approval_recipients(approval: Approval) -> list[dict]:
    """Who may decide it: the approval rules of ``approvals.policy`` (the permission,
    an authority covering the amount in its currency), never the one who asked."""
    users = [
        user
        for user in _operators(approval.tenant_id)
        if user_actor_name(user) != approval.requested_by
        and approver_problem(user, approval.tenant, approval.amount, approval.currency) is None
    ]
    return _recipients(users)


def case_recipients(case: ReconciliationCase) -> list[dict]:
    """Who may settle it: the operators whose role settles effects."""
    return _recipients(u for u in _operators(case.tenant_id) if u.has_perm(SETTLE_PERMISSION))


def event_facts(kind: str, object_id: int, *, tenant_id: int) -> dict:
    """What a notify run sends, read now: the notice, its recipients, and whether it
    still waits (an approval decided, or a case settled, before the run got to it
    is told to nobody)."""
    if kind == "approval":
        approval = Approval.objects.select_related("tenant").get(pk=object_id, tenant_id=tenant_id)
        notice = approval_notice(approval)
        waiting = approval.status == ApprovalStatus.PENDING
        recipients = approval_recipients(approval) if waiting else []
    else:
        case = ReconciliationCase.objects.select_related("tenant").get(
            pk=object_id, tenant_id=tenant_id
        )
        notice = case_notice(case)
        waiting = case.status == CaseStatus.OPEN
        recipients = case_recipients(case) if waiting else []
    return {
        "subject": notice.subject,
        "text": notice.text,
        "link": notice.link,
        "waiting": waiting,
        "recipients": recipients,
    }


def digest_listing(user_id: int, digest_request: str, *, tenant_id: int | None) -> dict:
    """One operator's digest: every entry the digest duty gave to ``digest_request``,
    oldest first, and the address (blank when the login is gone or deactivated)."""
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    entries = DigestEntry.objects.filter(
        user_id=user_id, tenant_id=tenant_id, digest_request=digest_request
    ).order_by("created_at", "id")
    items = [
        {"subject": entry.subject, "summary": entry.summary, "link": entry.link}
        for entry in entries
    ]
    lines = [f"{len(items)} notice(s) waited for you:", ""]
    for item in items:
        lines += [f"- {item['subject']}", f"  {item['link']}"]
    lines += ["", "Each link opens the card's page; acting needs you signed in."]
    return {
        "to": user.email if user is not None else "",
        "count": len(items),
        "subject": f"Holdfast digest: {len(items)} notice(s) waited",
        "body": mask_text("\n".join(lines)),
    }

"""The approval gate the engine calls before an approved effect's send.

Reading, requesting and invalidating are ordinary ORM writes. Consuming is
different: it is one guard statement run inside the engine's clearing commit,
so the step becomes ``running`` and the approval ``consumed`` together or not at
all. The guard re-checks everything in SQL with the database's clock (DESIGN
§8, §12.10): approved (or already consumed by this very effect), the argument
hash, the tenant, the expiry, the approver still active, still an operator of
the tenant, still holding the approve permission and the authority for the
amount in its currency, and the resource fingerprint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.models import Exists, OuterRef, Q
from django.db.models.lookups import IsNull

from agentruns.dbclock import DbNow, now_sql
from agentruns.runtime import ApprovalRequest, ApprovalState, Guard
from approvals.models import LIVE_STATUSES, Approval, ApprovalAuthority, ApprovalStatus
from approvals.policy import approver_problem

PERMISSION = ("accounts", "decide_approvals")

# Called with each approval that waits, when it is written and each time the step
# asks for it again (so after a crash too): whoever is told must be told once per
# approval whatever the number of calls. The composition root installs
# notifications' hook (config/wiring.py); without one nobody is told.
_requested_hooks: tuple[Callable[[Approval], None], ...] = ()


def install_requested_hooks(*hooks: Callable[[Approval], None]) -> None:
    global _requested_hooks
    _requested_hooks = hooks


def _requested(approval: Approval) -> None:
    for hook in _requested_hooks:
        hook(approval)


def _approver_still_authorised() -> Exists:
    """The approval's approver may still decide it: the rules of
    ``approvals.policy.approver_problem``, for the approval row it is used on."""
    User = get_user_model()
    app_label, codename = PERMISSION
    # The permission by its name, not a cached id: ids differ between databases.
    permission = Permission.objects.filter(content_type__app_label=app_label, codename=codename)
    # A role's authority in the approval's tenant and in the approval's currency
    # covers its amount (no limit when empty); a limit in another currency never does.
    authority = ApprovalAuthority.objects.filter(
        Q(max_amount__isnull=True) | Q(max_amount__gte=OuterRef(OuterRef("amount"))),
        group__user=OuterRef("pk"),
        tenant_id=OuterRef(OuterRef("tenant_id")),
        currency=OuterRef(OuterRef("currency")),
    )
    return Exists(
        User.objects.filter(
            pk=OuterRef("decided_by_id"),
            is_active=True,
            operator__tenant_id=OuterRef("tenant_id"),
        )
        .filter(
            Q(is_superuser=True)
            | Exists(permission.filter(user=OuterRef("pk")))
            | Exists(permission.filter(group__user=OuterRef("pk")))
        )
        # An action that moves no money needs no authority.
        .filter(IsNull(OuterRef("amount"), True) | Q(is_superuser=True) | Exists(authority))
    )


def _state(approval: Approval) -> ApprovalState:
    return ApprovalState(
        id=approval.pk,
        status=approval.status,
        args_hash=approval.args_hash,
        resource_fingerprint=approval.resource_fingerprint,
        resource_state=approval.resource_state or {},
        decided_by=approval.decided_by_name,
        note=approval.note,
        rerequested=approval.rerequested_at is not None,
        consumed_by_effect_key=approval.consumed_by_effect_key,
    )


class DatabaseApprovalGate:
    def latest(self, run_id: str, step_id: str) -> ApprovalState | None:
        approval = Approval.objects.filter(run_id=run_id, step_id=step_id).order_by("-id").first()
        return None if approval is None else _state(approval)

    def request(self, request: ApprovalRequest) -> int:
        live = Approval.objects.filter(
            run_id=request.run_id, step_id=request.step_id, status__in=LIVE_STATUSES
        ).first()
        if live is not None:
            # Asked again for the same call (a crash after the request was written,
            # a spurious wake-up): the live approval stands.
            if live.args_hash == request.args_hash:
                if live.is_pending:
                    _requested(live)
                return live.pk
            self.invalidate(live.pk, "the step's arguments differ from the approved ones")
        approval = Approval(
            tenant_id=request.tenant_id,
            run_id=request.run_id,
            step_id=request.step_id,
            tool=request.tool,
            args=request.args,
            args_hash=request.args_hash,
            effect_key=request.effect_key,
            requested_by=request.requested_by,
            resource=request.resource,
            resource_state=request.resource_state,
            resource_fingerprint=request.resource_fingerprint,
            preview=request.preview,
            amount=request.amount,
            currency=request.currency,
            created_at=DbNow(),
            # The database's clock decides expiry, here and in the guard.
            expires_at=DbNow() + request.expires_after,
            replaces_id=request.replaces,
            changes=request.changes,
            provider_refusal=request.refusal,
        )
        try:
            with transaction.atomic():
                approval.save(force_insert=True)
        except IntegrityError:
            # Another worker wrote the request first (one live approval per step).
            live = Approval.objects.get(
                run_id=request.run_id, step_id=request.step_id, status__in=LIVE_STATUSES
            )
            return live.pk
        _requested(approval)
        return approval.pk

    def consume_guard(
        self,
        approval_id: int,
        *,
        vendor: str,
        tenant_id: int,
        args_hash: str,
        resource_fingerprint: str,
        effect_key: str,
    ) -> Guard:
        approval = (
            Approval.objects.filter(
                pk=approval_id,
                tenant_id=tenant_id,
                args_hash=args_hash,
                resource_fingerprint=resource_fingerprint,
                expires_at__gt=DbNow(),
            )
            # Approved, or consumed by this same effect (a resend after its
            # absence was proven, DESIGN §8).
            .filter(
                Q(status=ApprovalStatus.APPROVED.value)
                | Q(status=ApprovalStatus.CONSUMED.value, consumed_by_effect_key=effect_key)
            )
            .filter(_approver_still_authorised())
        )
        # The conditions come from the ORM; the statement stays raw because the
        # store runs it on the raw connection inside its own transaction. Only the
        # WHERE is compiled, not ``id IN (SELECT id ...)``: its columns then name
        # the updated row itself, so on PostgreSQL a row a concurrent commit
        # changed (invalidated, say) is re-checked in its new version, not matched
        # through the old version a subquery saw.
        connection = connections[DEFAULT_DB_ALIAS]
        query = approval.query
        where, where_params = query.get_compiler(connection=connection).compile(query.where)
        now = now_sql(vendor)
        sql = (
            f"UPDATE {connection.ops.quote_name(Approval._meta.db_table)} "
            f"SET status = %s, consumed_at = {now}, consumed_by_effect_key = %s "
            f"WHERE {where} RETURNING id"
        )
        params: list[Any] = [ApprovalStatus.CONSUMED.value, effect_key, *where_params]
        return Guard(sql, params)

    def explain(
        self, approval_id: int, *, tenant_id: int, args_hash: str, resource_fingerprint: str
    ) -> str:
        approval = Approval.objects.select_related("decided_by").get(pk=approval_id)
        if approval.status not in (ApprovalStatus.APPROVED, ApprovalStatus.CONSUMED):
            return f"the approval is {approval.status}, not approved"
        if approval.tenant_id != tenant_id:
            return "the approval belongs to another tenant"
        if approval.args_hash != args_hash:
            return "the arguments differ from the approved ones"
        expired = Approval.objects.filter(pk=approval_id, expires_at__lte=DbNow()).exists()
        if expired:
            return "the approval expired before the action was sent"
        user = approval.decided_by
        if user is None:
            return "the approver's account no longer exists"
        problem = approver_problem(user, approval.tenant, approval.amount, approval.currency)
        if problem:
            return f"the approver can no longer approve it: {problem}"
        if approval.resource_fingerprint != resource_fingerprint:
            return f"{approval.resource} changed since the approval was requested"
        return "the approval no longer holds"

    def invalidate(self, approval_id: int, reason: str) -> None:
        Approval.objects.filter(
            pk=approval_id,
            status__in=[ApprovalStatus.PENDING, ApprovalStatus.APPROVED, ApprovalStatus.CONSUMED],
        ).update(status=ApprovalStatus.INVALIDATED, invalidated_reason=reason[:2000])

    def approval_for_effect(self, effect_key: str) -> int | None:
        return (
            # The first one: every send under one key carries the same approval id,
            # so the provider sees the same request each time.
            Approval.objects.filter(consumed_by_effect_key=effect_key)
            .order_by("id")
            .values_list("pk", flat=True)
            .first()
        )

    def withdraw(self, run_id: str, reason: str) -> None:
        Approval.objects.filter(Q(run_id=run_id), Q(status__in=LIVE_STATUSES)).update(
            status=ApprovalStatus.INVALIDATED, invalidated_reason=reason
        )

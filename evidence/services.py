"""Exporting a run's evidence: the bundle, its signatures, and the audit row that records it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from accounts.models import AuditEntry
from accounts.privacy import mask_text
from accounts.services import audit_record, user_actor_name
from agentruns.models import Run
from evidence.bundle import EXPORT_ACTION, run_bundle
from evidence.signing import sign, verify_command

FORMATS = ("json", "html")


@dataclass(frozen=True)
class Export:
    """One export of a run's evidence: the bundle and what names it."""

    run: Run
    bundle: dict[str, Any]
    sha256: str
    hmac_sha256: str
    exported_at: datetime
    exported_by: str

    @property
    def filename(self) -> str:
        return f"holdfast-evidence-{self.run.id}-{self.exported_at:%Y-%m-%d}.json"

    @property
    def verify_command(self) -> str:
        return verify_command(self.filename)

    def document(self) -> dict[str, Any]:
        """The downloaded file. Only ``bundle`` is signed; the rest says by whom and when
        it was exported (as the audit log does, with the hash) and how to check it."""
        return {
            "bundle": self.bundle,
            "sha256": self.sha256,
            "hmac_sha256": self.hmac_sha256,
            "exported_at": self.exported_at.isoformat(),
            "exported_by": self.exported_by,
            "verify": (
                "sha256 is the SHA-256 of the bundle's canonical JSON (sorted keys, "
                "separators ',' and ':', UTF-8, non-ASCII unescaped); this prints it: "
                f"{self.verify_command}. hmac_sha256 is checked by the deployment that "
                "exported it: manage.py verifyevidence <file>."
            ),
        }


def evidence_export(*, run: Run, user, fmt: str, request=None) -> Export:
    """Build ``run``'s evidence as ``user`` may read it, sign it, and audit the export.

    The audit row (``run.evidence_exported``, on the run) holds the hash and the format,
    so a bundle shown later can be matched to the export that produced it.
    """
    if fmt not in FORMATS:
        raise ValueError(f"no evidence format {fmt!r}")
    detail = user.has_perm("accounts.view_provider_errors")
    bundle = run_bundle(run, provider_error_detail=detail)
    signature = sign(bundle)
    actor = user_actor_name(user)
    entry = audit_record(
        tenant=run.tenant,
        actor=actor,
        action=EXPORT_ACTION,
        object_type="run",
        object_id=str(run.id),
        after={
            "format": fmt,
            "sha256": signature.sha256,
            "provider_errors": "detail" if detail else "category and reference",
        },
        request=request,
    )
    return Export(
        run=run,
        bundle=bundle,
        sha256=signature.sha256,
        hmac_sha256=signature.hmac_sha256,
        exported_at=entry.created_at.astimezone(UTC),
        exported_by=actor,
    )


def exports_of(run_id: str, sha256: str) -> list[AuditEntry]:
    """The audit log's exports of run ``run_id`` whose bundle had ``sha256``, oldest first."""
    # audit_record masks what it stores, and the card pattern of the masking rule takes
    # a Luhn-valid run of 13+ digits inside about one hex digest in 230: such a hash is
    # on record masked, and looked up as it is stored.
    return list(
        AuditEntry.objects.filter(
            action=EXPORT_ACTION,
            object_type="run",
            object_id=run_id,
            after__sha256__in=sorted({sha256, mask_text(sha256)}),
        ).order_by("created_at", "id")
    )

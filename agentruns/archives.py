"""A run's archive: its events and its steps' payloads, as one gzip'd JSON document.

When a tenant's retention period has passed since a run ended (``retention/``), the
run's event log and the input, exact request and result of each of its steps are
written here, to the blob storage (``default_storage``, as large results are), and
removed from the hot tables. The run row keeps its outcome and names the document
(``Run.archive_name``) and the SHA-256 of its canonical JSON (``Run.archive_sha256``);
the step rows keep everything else (identity, status, effect key, hashes, attempts,
times), so the run page's timeline, the effect-key searches and reconciliation's
history read them as before.

The document is a function of what it holds: canonical JSON (sorted keys) compressed
with a zero timestamp, so writing it again for the same run writes the same bytes. That
is what makes a crash between writing it and pruning the run harmless: the next pass
writes it again, under the same name, and prunes.

Readers (the run page, the evidence bundle) call ``run_archive`` and get the events and
payloads back as they were recorded.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from agentruns.models import Blob, Run, RunEvent, Step

FORMAT = "holdfast.run-archive/1"
# A redacted payload is replaced by this marker, which keeps the SHA-256 of the
# canonical JSON of what it replaced (retention's personal-data redaction).
REDACTED_KEY = "holdfast_redacted"


class ArchiveUnreadable(Exception):
    """The run's archive is missing, or its content is not what the run row says."""


def canonical_bytes(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def redaction_marker(value: Any, *, reason: str) -> dict[str, Any]:
    """What stands where ``value`` was: the reason and the hash of what was there."""
    return {REDACTED_KEY: reason, "sha256": hashlib.sha256(canonical_bytes(value)).hexdigest()}


def is_redacted(value: Any) -> bool:
    return isinstance(value, dict) and REDACTED_KEY in value


def archive_name(run: Run) -> str:
    return f"archives/runs/{run.tenant_id}/{run.id}.json.gz"


def _at(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _blob_value(sha256: str) -> Any:
    blob = Blob.objects.get(pk=sha256)
    with default_storage.open(blob.storage_name) as stored:
        return json.loads(stored.read())


def archive_document(run: Run, steps: list[Step], events: list[RunEvent]) -> dict[str, Any]:
    """The archive of ``run``: every step's payloads (a blob's content inline) and every event."""
    return {
        "format": FORMAT,
        "run": str(run.id),
        "tenant": run.tenant_id,
        "steps": [
            {
                "seq": step.seq,
                "step_id": step.step_id,
                "input": step.input,
                "request": step.request,
                "result": _blob_value(step.result_blob_id) if step.result_blob_id else step.result,
                "result_blob": step.result_blob_id,
            }
            for step in steps
        ],
        "events": [
            {
                "id": event.pk,
                "type": event.type,
                "state_version": event.state_version,
                "step_id": event.step_id,
                "payload": event.payload,
                "created_at": _at(event.created_at),
            }
            for event in events
        ],
    }


def archive_write(run: Run, document: dict[str, Any]) -> tuple[str, str]:
    """Store ``document`` as ``run``'s archive, replacing one an interrupted pass left.

    Returns the storage name and the SHA-256 of the document's canonical JSON.
    """
    content = canonical_bytes(document)
    name = archive_name(run)
    if default_storage.exists(name):
        # Left by a pass that stopped before it pruned the run: the same run, rewritten.
        default_storage.delete(name)
    stored = default_storage.save(name, ContentFile(gzip.compress(content, mtime=0)))
    return stored, hashlib.sha256(content).hexdigest()


@dataclass(frozen=True)
class RunArchive:
    """An archived run's events and step payloads, as they were recorded."""

    archived_at: datetime
    events: list[RunEvent]
    # seq -> {"input", "request", "result", "result_blob"}
    payloads: dict[int, dict[str, Any]]

    def fill(self, steps: list[Step]) -> list[Step]:
        """Put each step's archived payloads back on it (in memory; nothing is saved)."""
        for step in steps:
            payload = self.payloads.get(step.seq)
            if payload is None:
                continue
            step.input = payload["input"]
            step.request = payload["request"]
            step.result = payload["result"]
            step.result_blob_id = None
        return steps


def run_archive(run: Run) -> RunArchive:
    """Read ``run``'s archive back; ``ArchiveUnreadable`` if it is gone or altered."""
    if not run.archived_at or not run.archive_name:
        raise ArchiveUnreadable(f"run {run.id} is not archived")
    try:
        with default_storage.open(run.archive_name) as stored:
            content = gzip.decompress(stored.read())
    except (OSError, EOFError) as exc:
        raise ArchiveUnreadable(f"the archive of run {run.id} cannot be read: {exc}") from exc
    if hashlib.sha256(content).hexdigest() != run.archive_sha256:
        raise ArchiveUnreadable(f"the archive of run {run.id} does not match its SHA-256")
    document = json.loads(content)
    events = [
        RunEvent(
            pk=entry["id"],
            run_id=run.id,
            type=entry["type"],
            state_version=entry["state_version"],
            step_id=entry["step_id"],
            payload=entry["payload"],
            created_at=datetime.fromisoformat(entry["created_at"]),
        )
        for entry in document["events"]
    ]
    payloads = {entry["seq"]: entry for entry in document["steps"]}
    return RunArchive(archived_at=run.archived_at, events=events, payloads=payloads)

"""What a step's result looks like on record, and in memory after a write.

Results are JSON, recorded exactly as replay will return them; a large one is
stored once as a content-addressed blob and referenced from its step.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from agentruns.models import Blob, Step, StepStatus
from agentruns.runtime.effects import canonical_json, content_hash
from agentruns.runtime.tools import ToolResult
from agentruns.runtime.writes import NOW, Increment, Json, NowPlus, Sql


def result_columns(value: Any, *, inline_limit: int) -> dict[str, Any]:
    """The step columns that record ``value``: inline up to ``inline_limit`` bytes, else a blob."""
    text = canonical_json(value)
    digest = content_hash(value)
    if len(text.encode()) <= inline_limit:
        return {"result": Json(value), "result_hash": digest}
    blob_name = f"blobs/{digest[:2]}/{digest}.json"
    if not Blob.objects.filter(pk=digest).exists():
        if not default_storage.exists(blob_name):
            blob_name = default_storage.save(blob_name, ContentFile(text.encode()))
        Blob.objects.get_or_create(
            sha256=digest, defaults={"size": len(text.encode()), "storage_name": blob_name}
        )
    return {"result": None, "result_blob_id": digest, "result_hash": digest}


def load_result(step: Step) -> Any:
    if step.result_blob_id:
        blob = Blob.objects.get(pk=step.result_blob_id)
        with default_storage.open(blob.storage_name) as fh:
            return json.loads(fh.read())
    return step.result


def recorded_result(step: Step, step_id: str) -> ToolResult | None:
    """What a settled tool step answered, as agent code sees it; None while unsettled."""
    if step.status == StepStatus.SUCCEEDED:
        return ToolResult("succeeded", load_result(step), step_id=step_id)
    if step.status == StepStatus.FAILED:
        return ToolResult(
            "failed", error=step.last_error, error_class=step.last_error_class, step_id=step_id
        )
    return None


def json_safe(value: Any) -> Any:
    """Round-trip through JSON so what is recorded is exactly what replay returns."""
    if value is None:
        return None
    return json.loads(json.dumps(value, default=str))


def provider_reference(value: Any) -> str:
    """The provider's own id for what happened (a refund's ``re_…``), if the answer has one."""
    if isinstance(value, dict):
        for key in ("id", "reference", "provider_reference"):
            if isinstance(value.get(key), str):
                return value[key][:200]
    return ""


def describe(step: Step) -> dict[str, Any]:
    """A recorded step as a divergence report shows it."""
    return {
        "seq": step.seq,
        "step_id": step.step_id,
        "kind": step.kind,
        "name": step.name,
        "input_hash": step.input_hash,
        "status": step.status,
    }


def known(step: Step, values: dict[str, Any]) -> Step:
    """Apply written values to an in-memory step; database-side expressions are skipped."""
    for column, value in values.items():
        if isinstance(value, Json):
            value = value.value
        elif value is NOW or isinstance(value, (NowPlus, Sql, Increment)):
            continue
        setattr(step, column, value)
    return step


_STEP_DEFAULTS: dict[str, Any] | None = None


def new_step_view(pk: int) -> Any:
    """A step as plain attributes: a model instance costs more to build than a commit."""
    global _STEP_DEFAULTS
    if _STEP_DEFAULTS is None:
        _STEP_DEFAULTS = {f.attname: f.get_default() for f in Step._meta.concrete_fields}
    return SimpleNamespace(**{**_STEP_DEFAULTS, "id": pk, "pk": pk})

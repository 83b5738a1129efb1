"""A run's evidence, downloaded as JSON or read as a printable page; every export audited."""

from __future__ import annotations

import json
import uuid

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from accounts.access import operator_required
from accounts.services import for_tenant
from agentruns.archives import ArchiveUnreadable
from agentruns.models import Run
from evidence.services import Export, evidence_export


def _run_or_404(request: HttpRequest, run_id: uuid.UUID) -> Run:
    run = for_tenant(Run.objects.all(), request.tenant).filter(pk=run_id).first()
    if run is None:
        raise Http404("No such run.")
    return run


def _archive_unreadable(exc: ArchiveUnreadable) -> HttpResponse:
    # An archived run's events and payloads are only in its archive: without it the
    # bundle would be incomplete, so none is exported (and nothing is audited).
    return HttpResponse(
        f"This run's evidence cannot be exported: {exc}. Restore the archive from the "
        "media backup (README, Retention).",
        status=503,
        content_type="text/plain; charset=utf-8",
    )


def _signed(response: HttpResponse, export: Export) -> HttpResponse:
    response["X-Evidence-SHA256"] = export.sha256
    return response


# never_cache: each reading is an audited export; a cached copy would be one unaudited.
@require_GET
@never_cache
@operator_required("view_runs")
def run_evidence_json(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    run = _run_or_404(request, run_id)
    try:
        export = evidence_export(run=run, user=request.user, fmt="json", request=request)
    except ArchiveUnreadable as exc:
        return _archive_unreadable(exc)
    body = json.dumps(export.document(), indent=2, sort_keys=True, ensure_ascii=False)
    response = HttpResponse(body.encode("utf-8"), content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{export.filename}"'
    return _signed(response, export)


@require_GET
@never_cache
@operator_required("view_runs")
def run_evidence_page(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    run = _run_or_404(request, run_id)
    try:
        export = evidence_export(run=run, user=request.user, fmt="html", request=request)
    except ArchiveUnreadable as exc:
        return _archive_unreadable(exc)
    context = {"export": export, "bundle": export.bundle, "run": export.bundle["run"]}
    return _signed(render(request, "evidence/run_evidence.html", context), export)

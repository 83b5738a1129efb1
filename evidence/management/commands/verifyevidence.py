from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from evidence.services import exports_of
from evidence.signing import verify


class Command(BaseCommand):
    help = (
        "Check a downloaded evidence file: its SHA-256, its HMAC under this deployment's "
        "secret key, and the audit log's record of its export. Exits 1 unless the first two hold."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", help="a file downloaded from /runs/<id>/evidence.json")

    def handle(self, *args, file: str, **options):
        try:
            document = json.loads(Path(file).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot read {file}: {exc}") from None
        if not isinstance(document, dict) or not isinstance(document.get("bundle"), dict):
            raise CommandError(f"{file} is not an evidence file: it has no bundle")
        verdict = verify(document)
        run_id = str((document["bundle"].get("run") or {}).get("id", ""))
        lines = [f"run {run_id or '(none named)'}", f"sha256 {verdict.sha256}"]
        lines.append(
            "sha256: matches the one the file states"
            if verdict.sha256_matches
            else f"sha256: DOES NOT MATCH the one the file states ({document.get('sha256')})"
        )
        lines.append(
            "hmac: made by this deployment"
            if verdict.hmac_matches
            else "hmac: NOT made by this deployment's key (or its fallbacks): the file was "
            "changed, or exported elsewhere"
        )
        exports = exports_of(run_id, verdict.sha256)
        if exports:
            lines.extend(
                f"exported {entry.created_at.isoformat()} by {entry.actor} "
                f"as {(entry.after or {}).get('format', '?')}"
                for entry in exports
            )
        else:
            lines.append("no export of this run with this sha256 is in the audit log")
        self.stdout.write("\n".join(lines))
        if not (verdict.sha256_matches and verdict.hmac_matches):
            raise CommandError("the evidence does not verify")

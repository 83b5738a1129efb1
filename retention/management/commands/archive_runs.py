from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from accounts.models import Tenant
from accounts.services import audit_record
from retention.services import held_counts, retention_pass

ACTOR = "manage.py archive_runs"


class Command(BaseCommand):
    help = (
        "Apply each tenant's retention now: redact the personal data of runs past its "
        "'redact personal data after' period, archive the events and step payloads of runs "
        "past its retention period, batch after batch until none is left. Prints what it "
        "did per tenant; each tenant's work is written to its audit log."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="only this tenant (its slug)")
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be done, change nothing"
        )
        parser.add_argument("--batch", type=int, help="runs per batch (default: the setting)")

    def handle(self, *args, tenant: str | None, dry_run: bool, batch: int | None, **options):
        tenants = list(Tenant.objects.order_by("slug"))
        if tenant is not None:
            tenants = [t for t in tenants if t.slug == tenant]
            if not tenants:
                raise CommandError(f"no tenant {tenant!r}")
        if batch is not None and batch < 1:
            raise CommandError("--batch must be at least 1")

        redacted: dict[str, int] = {}
        archived: dict[str, int] = {}
        failed: dict[str, int] = {}
        while True:
            report = retention_pass(tenants=tenants, limit=batch, dry_run=dry_run)
            for total, done in (
                (redacted, report.redacted),
                (archived, report.archived),
                (failed, report.failed),
            ):
                for slug, count in done.items():
                    total[slug] = total.get(slug, 0) + count
            # A dry pass changes nothing, so its first batch is all it can count; a batch
            # of nothing but failures would fail again.
            if dry_run or not report.total:
                break
        held = held_counts(tenants)

        verb = ("would redact", "would archive") if dry_run else ("redacted", "archived")
        for each in tenants:
            policy = f"runs kept {each.retention_days} days after they end" + (
                f", personal data {each.personal_data_days}"
                if each.personal_data_days is not None
                else ""
            )
            line = (
                f"{each.slug} ({policy}): {verb[0]} {redacted.get(each.slug, 0)}, "
                f"{verb[1]} {archived.get(each.slug, 0)}, "
                f"kept {held.get(each.slug, 0)} (not ended, an open case or an unconsumed "
                "approval)"
            )
            if failed.get(each.slug):
                line += f"; FAILED {failed[each.slug]} (logged; tried again next pass)"
            self.stdout.write(line)
            done = redacted.get(each.slug, 0) + archived.get(each.slug, 0)
            if done and not dry_run:
                audit_record(
                    tenant=each,
                    actor=ACTOR,
                    action="runs.archived",
                    object_type="tenant",
                    object_id=each.slug,
                    after={
                        "redacted": redacted.get(each.slug, 0),
                        "archived": archived.get(each.slug, 0),
                        "retention_days": each.retention_days,
                        "personal_data_days": each.personal_data_days,
                    },
                )
        if dry_run:
            self.stdout.write("dry run: nothing was changed (counts are of one batch at most)")

"""A tenant's auto-approval amount becomes per currency.

It was one bare number of minor units, compared with a refund in whatever currency the
refund was in. It now names its currency: {"eur": 5000}. A bare amount becomes the same
amount in EUR, the currency every tenant's refunds were configured and demonstrated in;
for any other currency a refund then waits for an approver, which asks for more
approvals than before and never for fewer. Runs already started keep what they pinned.
"""

from django.db import migrations


def _per_currency(config):
    changed = False
    for settings in config.values():
        approvals = settings.get("approvals") if isinstance(settings, dict) else None
        if not isinstance(approvals, dict):
            continue
        limit = approvals.get("auto_approve_up_to")
        if isinstance(limit, int) and not isinstance(limit, bool):
            approvals["auto_approve_up_to"] = {"eur": limit}
            changed = True
    return changed


def make_per_currency(apps, schema_editor):
    Tenant = apps.get_model("accounts", "Tenant")
    for tenant in Tenant.objects.exclude(agent_config={}):
        config = tenant.agent_config
        if isinstance(config, dict) and _per_currency(config):
            tenant.agent_config = config
            tenant.save(update_fields=["agent_config"])


class Migration(migrations.Migration):
    dependencies = [("accounts", "0008_provider_error_permission")]

    operations = [migrations.RunPython(make_per_currency, migrations.RunPython.noop)]

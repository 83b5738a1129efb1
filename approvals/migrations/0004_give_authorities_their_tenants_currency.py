"""Give each existing authority the currency its tenant's approvals have been in.

Until 0003 a limit was a bare number applied to any currency. The currency it was
set with in mind is the one the tenant's money-moving approvals were in, so each
row keeps covering what it covered in practice: the tenant's most frequent
approval currency, or "eur" (the demo shop's currency) when the tenant has none
yet. A tenant whose approvals came in several currencies keeps authority only in
the most frequent one: copying one number into another currency (500.00 EUR into
500 JPY) is exactly the mistake this change ends, so an admin adds the others.
"""

from django.db import migrations
from django.db.models import Count

DEFAULT_CURRENCY = "eur"


def give_authorities_their_tenants_currency(apps, schema_editor):
    Approval = apps.get_model("approvals", "Approval")
    ApprovalAuthority = apps.get_model("approvals", "ApprovalAuthority")
    for tenant_id in ApprovalAuthority.objects.values_list("tenant_id", flat=True).distinct():
        most_used = (
            Approval.objects.filter(tenant_id=tenant_id, amount__isnull=False)
            .exclude(currency="")
            .values("currency")
            .annotate(approvals=Count("id"))
            .order_by("-approvals", "currency")
            .first()
        )
        currency = most_used["currency"].lower() if most_used else DEFAULT_CURRENCY
        ApprovalAuthority.objects.filter(tenant_id=tenant_id).update(currency=currency)


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0003_approvalauthority_currency"),
    ]

    operations = [
        migrations.RunPython(give_authorities_their_tenants_currency, migrations.RunPython.noop),
    ]

from django.db import migrations, models


class Migration(migrations.Migration):
    """One authority per role, tenant and currency (was: per role and tenant)."""

    dependencies = [
        ("approvals", "0004_give_authorities_their_tenants_currency"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="approvalauthority",
            name="authority_one_per_role",
        ),
        migrations.AddConstraint(
            model_name="approvalauthority",
            constraint=models.UniqueConstraint(
                fields=("tenant", "group", "currency"), name="authority_one_per_role_currency"
            ),
        ),
    ]

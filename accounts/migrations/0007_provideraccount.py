import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0006_apitoken_owner"),
    ]

    operations = [
        migrations.CreateModel(
            name="ProviderAccount",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("provider", models.SlugField(max_length=32)),
                ("endpoint", models.URLField(blank=True)),
                (
                    "secret_ref",
                    models.CharField(blank=True, max_length=200, verbose_name="secret reference"),
                ),
                ("sender", models.EmailField(blank=True, max_length=254)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="provider_accounts",
                        to="accounts.tenant",
                    ),
                ),
            ],
            options={
                "ordering": ["tenant", "provider"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("tenant", "provider"), name="provider_account_one_per_tenant"
                    )
                ],
            },
        ),
    ]

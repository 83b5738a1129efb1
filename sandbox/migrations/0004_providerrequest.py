import sandbox.clock
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sandbox", "0003_give_existing_rows_the_demo_account"),
    ]

    operations = [
        migrations.CreateModel(
            name="ProviderRequest",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("account", models.CharField(blank=True, max_length=64)),
                ("method", models.CharField(max_length=8)),
                ("path", models.TextField()),
                ("status", models.PositiveSmallIntegerField(blank=True, null=True)),
                (
                    "fault",
                    models.CharField(
                        blank=True,
                        choices=[
                            ("drop_after_commit", "Drop After Commit"),
                            ("delay", "Delay"),
                            ("error_before", "Error Before"),
                            ("error_after", "Error After"),
                            ("rate_limit", "Rate Limit"),
                            ("refuse", "Refuse"),
                        ],
                        max_length=32,
                    ),
                ),
                ("received_at", models.DateTimeField(default=sandbox.clock.now)),
            ],
            options={
                "indexes": [
                    models.Index(fields=["account", "id"], name="provider_request_account")
                ],
            },
        ),
    ]

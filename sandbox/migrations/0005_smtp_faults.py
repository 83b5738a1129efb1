from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sandbox", "0004_providerrequest"),
    ]

    operations = [
        migrations.AddField(
            model_name="fault",
            name="smtp_code",
            field=models.PositiveSmallIntegerField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="fault",
            name="kind",
            field=models.CharField(
                choices=[
                    ("drop_after_commit", "Drop After Commit"),
                    ("delay", "Delay"),
                    ("error_before", "Error Before"),
                    ("error_after", "Error After"),
                    ("rate_limit", "Rate Limit"),
                    ("refuse", "Refuse"),
                    ("smtp_drop_after_accept", "Smtp Drop After Accept"),
                    ("smtp_refuse", "Smtp Refuse"),
                    ("smtp_delay", "Smtp Delay"),
                ],
                max_length=32,
            ),
        ),
        migrations.AlterField(
            model_name="providerrequest",
            name="fault",
            field=models.CharField(
                blank=True,
                choices=[
                    ("drop_after_commit", "Drop After Commit"),
                    ("delay", "Delay"),
                    ("error_before", "Error Before"),
                    ("error_after", "Error After"),
                    ("rate_limit", "Rate Limit"),
                    ("refuse", "Refuse"),
                    ("smtp_drop_after_accept", "Smtp Drop After Accept"),
                    ("smtp_refuse", "Smtp Refuse"),
                    ("smtp_delay", "Smtp Delay"),
                ],
                max_length=32,
            ),
        ),
    ]

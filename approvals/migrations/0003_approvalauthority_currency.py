import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    """Authority becomes per currency: the column. Existing rows get theirs in 0004."""

    dependencies = [
        ("approvals", "0002_approval_provider_refusal"),
    ]

    operations = [
        migrations.AddField(
            model_name="approvalauthority",
            name="currency",
            field=models.CharField(
                default="",
                max_length=3,
                validators=[
                    django.core.validators.RegexValidator(
                        "^[a-z]{3}$", "A lower-case ISO 4217 code, such as eur or jpy."
                    )
                ],
            ),
            preserve_default=False,
        ),
    ]

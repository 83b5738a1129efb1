from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sandbox", "0001_initial"),
    ]

    operations = [
        # Blank only until 0003 gives the existing rows the demo key's account.
        migrations.AddField(
            model_name="paymentintent",
            name="account",
            field=models.CharField(default="", max_length=64),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="order",
            name="account",
            field=models.CharField(default="", max_length=64),
            preserve_default=False,
        ),
        migrations.AddIndex(
            model_name="paymentintent",
            index=models.Index(fields=["account"], name="payment_intent_account"),
        ),
        migrations.AddIndex(
            model_name="order",
            index=models.Index(fields=["account"], name="order_account"),
        ),
    ]

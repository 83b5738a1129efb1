"""Give the payment intents and orders made before accounts existed the demo key's account.

Until 0002 every caller saw every row, and only the seed made them: they are the demo
orders, which the demo key (sk_test_sandbox) reads and seedsandbox finds again. Their
refunds follow them, since a refund belongs to its payment intent's account.
"""

from django.db import migrations

# sandbox.accounts.account_for("sk_test_sandbox"), frozen as this migration ran.
DEMO_ACCOUNT = "acct_f5c8bb5a44b28cfb"


def give_existing_rows_the_demo_account(apps, schema_editor):
    database = schema_editor.connection.alias
    for name in ("PaymentIntent", "Order"):
        model = apps.get_model("sandbox", name)
        model.objects.using(database).filter(account="").update(account=DEMO_ACCOUNT)


class Migration(migrations.Migration):
    dependencies = [
        ("sandbox", "0002_payment_intent_and_order_account"),
    ]

    operations = [
        migrations.RunPython(give_existing_rows_the_demo_account, migrations.RunPython.noop),
    ]

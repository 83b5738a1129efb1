from __future__ import annotations

from django.core.management.base import BaseCommand

from sandbox.models import DB, Order


class Command(BaseCommand):
    help = "Create the sandbox's demo orders and payment intents (idempotent)."

    def handle(self, *args, **options) -> None:
        from sandbox.seed import seed

        for order_id, created in seed():
            order = Order.objects.using(DB).get(id=order_id)
            status = "created" if created else "exists "
            self.stdout.write(
                f"{status} {order.id} {order.payment_intent_id} {order.amount} "
                f"{order.currency.upper()} {order.customer_email}"
            )

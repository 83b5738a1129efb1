from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from sandbox.models import DB, Order
from sandbox.responses import ApiError
from sandbox.seed import DEMO_API_KEY, DEMO_FIRST_NUMBER, seed


class Command(BaseCommand):
    help = (
        "Create the sandbox's demo orders and payment intents in one API key's account "
        "(idempotent)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--api-key",
            default=DEMO_API_KEY,
            help=f"The key whose account gets the orders (default: {DEMO_API_KEY}).",
        )
        parser.add_argument(
            "--first-number",
            type=int,
            default=DEMO_FIRST_NUMBER,
            help=(
                f"Number the orders from here (default: {DEMO_FIRST_NUMBER}, so ord_1001…); "
                "ids are global, so each account needs numbers of its own."
            ),
        )

    def handle(self, *args, api_key: str, first_number: int, **options) -> None:
        try:
            seeded = seed(api_key, first_number)
        except ApiError as exc:
            raise CommandError(exc.message) from None
        for order_id, created in seeded:
            order = Order.objects.using(DB).get(id=order_id)
            status = "created" if created else "exists "
            self.stdout.write(
                f"{status} {order.id} {order.payment_intent_id} {order.amount} "
                f"{order.currency.upper()} {order.customer_email}"
            )

from __future__ import annotations

from django.db import models

from sandbox import clock

# Every sandbox model lives in the "sandbox" database (config.routers.SandboxRouter).
DB = "sandbox"


class PaymentIntent(models.Model):
    """A captured payment, as the provider sees it (Stripe's ``payment_intent`` object)."""

    class Status(models.TextChoices):
        SUCCEEDED = "succeeded"

    id = models.CharField(primary_key=True, max_length=64)
    # sandbox.accounts.account_for(api_key) of the key that owns it; ids stay global.
    account = models.CharField(max_length=64)
    amount = models.PositiveBigIntegerField()
    amount_received = models.PositiveBigIntegerField()
    currency = models.CharField(max_length=3)
    customer = models.CharField(max_length=64, blank=True)
    # The one charge each sandbox payment intent has; refunds are counted against it.
    charge_id = models.CharField(max_length=64)
    metadata = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=32, choices=Status.choices, default=Status.SUCCEEDED)
    created = models.DateTimeField(default=clock.now)

    class Meta:
        indexes = [
            # GET /v1/refunds without payment_intent: the account's refunds, reached
            # through its payment intents; and /_sandbox/stats' refunds per account.
            models.Index(fields=["account"], name="payment_intent_account"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.amount_received} {self.currency}"


class Refund(models.Model):
    class Status(models.TextChoices):
        SUCCEEDED = "succeeded"

    id = models.CharField(primary_key=True, max_length=64)
    payment_intent = models.ForeignKey(
        PaymentIntent, on_delete=models.CASCADE, related_name="refunds"
    )
    amount = models.PositiveBigIntegerField()
    currency = models.CharField(max_length=3)
    status = models.CharField(max_length=32, choices=Status.choices, default=Status.SUCCEEDED)
    reason = models.CharField(max_length=64, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    # The Idempotency-Key of the request that created it: /_sandbox/stats counts effects
    # per key from the provider's own rows.
    idempotency_key = models.CharField(max_length=255, blank=True)
    created = models.DateTimeField(default=clock.now)

    class Meta:
        indexes = [
            # GET /v1/refunds?payment_intent=…, newest first, paged by (created, id).
            models.Index(fields=["payment_intent", "-created", "-id"], name="refund_pi_newest"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.amount} {self.currency} of {self.payment_intent_id}"


class IdempotencyRecord(models.Model):
    """The saved outcome of the first POST made with one key (Stripe API v1 semantics).

    The unique (scope, key) row is the lock: whoever inserts it executes; anyone else
    with the key sees it in flight (409) or replays its saved status and body.
    """

    class State(models.TextChoices):
        IN_FLIGHT = "in_flight"
        DONE = "done"

    # sha256 of the API key (and Stripe-Account): keys are scoped per account.
    scope = models.CharField(max_length=64)
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=255)
    # The decoded form parameters as a sorted list of [name, value] pairs (a multiset).
    params_fingerprint = models.JSONField(default=list)
    state = models.CharField(max_length=16, choices=State.choices, default=State.IN_FLIGHT)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.TextField(blank=True)
    created_at = models.DateTimeField(default=clock.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "key"], name="idempotency_scope_key"),
        ]
        indexes = [
            # Pruning: DELETE … WHERE created_at < now - ttl.
            models.Index(fields=["created_at"], name="idempotency_created"),
        ]

    def __str__(self) -> str:
        return f"{self.method} {self.path} key={self.key} {self.state}"


class Order(models.Model):
    """An order in the shop the support agent looks up."""

    id = models.CharField(primary_key=True, max_length=64)
    # The account of the key that may read it: its payment intent's account.
    account = models.CharField(max_length=64)
    customer_name = models.CharField(max_length=200)
    customer_email = models.EmailField()
    items = models.JSONField(default=list)
    amount = models.PositiveBigIntegerField()
    currency = models.CharField(max_length=3)
    payment_intent = models.ForeignKey(
        PaymentIntent, on_delete=models.PROTECT, related_name="orders"
    )
    created = models.DateTimeField(default=clock.now)

    class Meta:
        indexes = [
            # An account's orders, as a shop lists them (GET /shop/orders/<id> itself
            # reads by primary key).
            models.Index(fields=["account"], name="order_account"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.customer_email}"


class MailMessage(models.Model):
    """Every message the SMTP sink accepted."""

    mail_from = models.CharField(max_length=320)
    rcpt_tos = models.JSONField(default=list)
    subject = models.CharField(max_length=998, blank=True)
    message_id = models.CharField(max_length=998, blank=True)
    body = models.TextField(blank=True)
    raw = models.TextField(blank=True)
    received_at = models.DateTimeField(default=clock.now)

    def __str__(self) -> str:
        return f"{self.mail_from} → {', '.join(self.rcpt_tos)}: {self.subject}"


class Fault(models.Model):
    """A fault armed for the next ``remaining`` requests matching method and path prefix,
    or, for the ``smtp_*`` kinds, for the next messages the SMTP sink is sent."""

    class Kind(models.TextChoices):
        DROP_AFTER_COMMIT = "drop_after_commit"
        DELAY = "delay"
        ERROR_BEFORE = "error_before"
        ERROR_AFTER = "error_after"
        RATE_LIMIT = "rate_limit"
        REFUSE = "refuse"
        SMTP_DROP_AFTER_ACCEPT = "smtp_drop_after_accept"
        SMTP_REFUSE = "smtp_refuse"
        SMTP_DELAY = "smtp_delay"

    kind = models.CharField(max_length=32, choices=Kind.choices)
    # Empty method matches any method.
    method = models.CharField(max_length=8, blank=True)
    path_prefix = models.CharField(max_length=255, default="/")
    remaining = models.PositiveIntegerField(default=1)
    delay_seconds = models.FloatField(default=0)
    retry_after = models.PositiveIntegerField(default=1)
    # The reply an smtp_refuse gives each recipient (4xx or 5xx); null for other kinds.
    smtp_code = models.PositiveSmallIntegerField(null=True, blank=True)
    created = models.DateTimeField(default=clock.now)

    def __str__(self) -> str:
        if self.kind.startswith("smtp_"):
            return f"{self.kind} x{self.remaining}"
        return f"{self.kind} {self.method or '*'} {self.path_prefix} x{self.remaining}"


class ProviderRequest(models.Model):
    """One request to ``/v1/...`` or ``/shop/...``, written before its reply is sent.

    The provider's own record of what it was asked: a test proves that no provider call
    was made by finding no row for its account.
    """

    # Blank when the request carried no API key (answered 401).
    account = models.CharField(max_length=64, blank=True)
    method = models.CharField(max_length=8)
    # As sent on the request line, query string included.
    path = models.TextField()
    # Null when the reply was dropped (the drop_after_commit fault).
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    fault = models.CharField(max_length=32, choices=Fault.Kind.choices, blank=True)
    received_at = models.DateTimeField(default=clock.now)

    class Meta:
        indexes = [
            # GET /_sandbox/requests?api_key=…: an account's newest requests.
            models.Index(fields=["account", "id"], name="provider_request_account"),
        ]

    def __str__(self) -> str:
        return f"{self.method} {self.path} -> {self.status or 'dropped'} {self.account or '-'}"


class WebhookDelivery(models.Model):
    """One message an incoming webhook accepted (a chat's "incoming webhook" URL).

    The channel in the URL names where it was posted, like the token in a Slack hook
    URL. A message posted again with the same ``Idempotency-Key`` is the same
    delivery: the unique (channel, key) row is the lock, so two sends of one message
    leave one row, and a sender that lost the reply can look its key up.
    """

    channel = models.CharField(max_length=100)
    # Blank when the sender sent none: then every post is a delivery of its own.
    idempotency_key = models.CharField(max_length=255, blank=True)
    body = models.JSONField(default=dict)
    # The signature header the sender computed, as received (blank without one):
    # ``webhook-signature`` of a Standard Webhooks post, else ``X-Holdfast-Signature``.
    signature = models.CharField(max_length=500, blank=True)
    # A Standard Webhooks post's ``webhook-timestamp`` and its body as sent, byte for
    # byte, so a receiver's check of the signature can be done again on the record.
    timestamp = models.CharField(max_length=20, blank=True)
    raw_body = models.TextField(blank=True)
    received_at = models.DateTimeField(default=clock.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["channel", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="webhook_one_delivery_per_key",
            ),
        ]

    def __str__(self) -> str:
        return f"webhook {self.channel} key={self.idempotency_key or '-'}"

"""One event to one endpoint: signed as documented, retried until delivered, refused
for good on a 4xx, and delivered once per webhook-id whatever happens on the way."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from agentruns.models import Run, Step
from webhooks import signing
from webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db(transaction=True)

README = Path(__file__).resolve().parents[2] / "README.md"


def _headers(received: dict) -> dict[str, str]:
    return {
        "webhook-id": received["idempotency_key"],
        "webhook-timestamp": received["timestamp"],
        "webhook-signature": received["signature"],
    }


def test_a_run_that_ends_is_posted_signed_and_the_receiver_verifies_it(world):
    _, secret = world.endpoint()
    run = world.refund_ended(request_id="ticket-for-bob@example.com")
    [delivery_run] = world.deliver_all()
    assert delivery_run.status == "completed", delivery_run.outcome_detail
    assert delivery_run.outcome_code == "delivered"

    [received] = world.received()
    delivery = world.only_delivery()
    assert received["channel"] == "acme"
    # The webhook-id is the delivery's message id, the receiver's key.
    assert received["idempotency_key"] == delivery.message_id
    body = received["raw_body"].encode()
    signing.verify(secret, _headers(received), body)
    payload = json.loads(body)
    assert payload == {
        "id": delivery.event.public_id,
        "type": "run.ended",
        "created_at": payload["created_at"],
        "tenant": "default",
        "data": {
            "object": "run",
            "id": str(run.pk),
            "status": "completed",
            "agent": "refund_support",
            # Personal data is masked by the one rule, as the API shows it.
            "request_id": "••••@example.com",
            "url": f"http://127.0.0.1:8000/api/v1/runs/{run.pk}",
        },
    }
    assert "bob@" not in received["raw_body"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z", payload["created_at"])
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.DELIVERED
    assert (delivery.attempts, delivery.last_status_code) == (1, 200)
    assert delivery.delivered_at is not None
    # Another secret, or a body changed on the way, does not verify.
    with pytest.raises(signing.SignatureError):
        signing.verify(signing.secret_new(), _headers(received), body)
    with pytest.raises(signing.SignatureError):
        signing.verify(secret, _headers(received), body.replace(b"completed", b"failed"))
    # Nor does the same message replayed after the window.
    late = int(received["timestamp"]) + signing.REPLAY_WINDOW_SECONDS + 1
    with pytest.raises(signing.SignatureError, match="replay window"):
        signing.verify(secret, _headers(received), body, now=late)
    # The secret is nowhere in what the run recorded.
    step = Step.objects.get(run=delivery_run, name="deliver_webhook")
    recorded = json.dumps([step.request, step.input, step.result, step.last_error])
    assert secret not in recorded and secret.removeprefix("whsec_") not in recorded


def test_the_readme_snippet_verifies_a_delivery(world):
    """README "Webhooks" shows a receiver's check in plain Python: it works as shown."""
    _, secret = world.endpoint()
    world.refund_ended()
    world.deliver_all()
    [received] = world.received()
    text = README.read_text()
    section = text[text.index("## Webhooks") :]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)
    verify = namespace["verify_webhook"]
    payload = verify(secret, _headers(received), received["raw_body"].encode())
    assert payload["type"] == "run.ended"
    with pytest.raises(ValueError):
        verify(signing.secret_new(), _headers(received), received["raw_body"].encode())


def test_a_500_is_retried_then_delivered(world):
    world.endpoint()
    world.refund_ended()
    world.sandbox.arm("error_before", path="/hooks/acme")
    [run] = world.delivery_runs()
    assert world.harness.advance(run).startswith("suspended:waiting_for_retry")
    delivery = world.only_delivery()
    assert delivery.status == DeliveryStatus.RETRYING
    assert (delivery.attempts, delivery.last_status_code) == (1, 500)
    run.refresh_from_db()
    assert run.next_attempt_at > timezone.now()
    assert world.received() == []

    run = world.harness.drive(run)
    assert run.status == "completed", run.outcome_detail
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.DELIVERED
    assert (delivery.attempts, delivery.last_status_code) == (2, 200)
    assert len(world.received()) == 1


def test_a_timeout_is_retried_under_the_same_id_and_delivered_once(world, settings):
    settings.HOLDFAST_WEBHOOK_TIMEOUT_SECONDS = 0.5
    world.endpoint()
    world.refund_ended()
    # The receiver takes it but answers after the sender stopped waiting.
    world.sandbox.arm("delay", path="/hooks/acme", delay=1.0)
    [run] = world.delivery_runs()
    assert world.harness.advance(run).startswith("suspended:waiting_for_retry")
    delivery = world.only_delivery()
    assert delivery.status == DeliveryStatus.RETRYING
    assert delivery.last_status_code is None
    assert delivery.last_error == "no answer within 0.5 s"

    run = world.harness.drive(run)
    assert run.status == "completed", run.outcome_detail
    # The first attempt arrives late, after the resend: it is the same message.
    time.sleep(1.0)
    [received] = world.received()
    assert received["idempotency_key"] == delivery.message_id
    stats = world.sandbox.stats()["webhooks"]
    assert stats["by_idempotency_key"] == {delivery.message_id: 1}


def test_a_refused_connection_is_retried_until_the_endpoint_listens(world):
    endpoint, _ = world.endpoint(url="http://127.0.0.1:9/hooks/nobody")
    world.refund_ended()
    [run] = world.delivery_runs()
    assert world.harness.advance(run).startswith("suspended:waiting_for_retry")
    delivery = world.only_delivery()
    assert (delivery.status, delivery.last_error) == (
        DeliveryStatus.RETRYING,
        "the connection was refused",
    )
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url=f"{world.sandbox.url}/hooks/acme")
    run = world.harness.drive(run)
    assert run.status == "completed", run.outcome_detail
    assert len(world.received()) == 1


def test_a_429_waits_at_least_its_retry_after(world):
    world.endpoint()
    world.refund_ended()
    world.sandbox.arm("rate_limit", path="/hooks/acme", retry_after=30)
    [run] = world.delivery_runs()
    before = timezone.now()
    world.harness.advance(run)
    run.refresh_from_db()
    assert run.status == "waiting_for_retry"
    assert run.next_attempt_at >= before + timedelta(seconds=29)
    assert world.only_delivery().last_status_code == 429


def test_a_4xx_is_a_definite_refusal_never_sent_again(world):
    # An address the receiver does not have: 404.
    world.endpoint(url=f"{world.sandbox.url}/hooks/acme/no-such-path")
    world.refund_ended()
    [run] = world.deliver_all()
    assert run.status == "completed"
    assert run.outcome_code == "endpoint_refused"
    delivery = world.only_delivery()
    assert delivery.status == DeliveryStatus.REFUSED
    assert (delivery.attempts, delivery.last_status_code) == (1, 404)
    assert delivery.delivered_at is None
    step = Step.objects.get(run=run, name="deliver_webhook")
    assert (step.status, step.attempts) == ("failed", 1)


def test_a_delivery_is_given_up_after_its_last_attempt(world, monkeypatch):
    monkeypatch.setattr("webhooks.tools.MAX_ATTEMPTS", 2)
    world.endpoint()
    world.refund_ended()
    world.sandbox.arm("error_before", path="/hooks/acme", count=5)
    [run] = world.deliver_all()
    assert (run.status, run.outcome_code) == ("completed", "gave_up")
    delivery = world.only_delivery()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == (
        DeliveryStatus.FAILED,
        2,
        500,
    )
    assert world.received() == []


@pytest.mark.parametrize(
    ("point", "received"),
    [("after_step_running", 0), ("after_call_returned", 1), ("after_result_recorded", 1)],
)
def test_a_worker_killed_at_any_point_leaves_one_delivery(world, point, received):
    world.endpoint()
    world.refund_ended()
    [run] = world.delivery_runs()
    world.harness.interrupt(run, point, "deliver_webhook")
    assert len(world.received()) == received
    run = world.harness.drive(run)
    assert run.status == "completed", run.outcome_detail
    stats = world.sandbox.stats()["webhooks"]
    assert stats["total"] == 1
    assert stats["by_idempotency_key"] == {world.only_delivery().message_id: 1}


def test_a_disabled_endpoint_is_sent_nothing(world):
    endpoint, _ = world.endpoint()
    world.refund_ended()
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(is_active=False)
    [run] = world.deliver_all()
    assert (run.status, run.outcome_code) == ("completed", "endpoint_disabled")
    assert world.only_delivery().status == DeliveryStatus.SKIPPED
    assert world.received() == []
    # And a disabled endpoint is not given the next events at all.
    world.refund_ended()
    assert WebhookDelivery.objects.count() == 1
    assert Run.objects.filter(agent_name="webhook_deliver").count() == 1


def test_a_rotated_secret_and_its_predecessor_both_sign_during_the_grace(world):
    from webhooks.services import endpoint_rotate

    endpoint, old = world.endpoint()
    new = endpoint_rotate(endpoint=endpoint, user=world.admin)
    world.refund_ended()
    world.deliver_all()
    [received] = world.received()
    body = received["raw_body"].encode()
    assert len(received["signature"].split()) == 2
    signing.verify(new, _headers(received), body)
    signing.verify(old, _headers(received), body)


def test_a_redirect_is_not_followed_and_refuses_the_delivery(world):
    """An endpoint is the address its admin typed: a 3xx elsewhere is not followed."""
    import http.server
    import threading

    class Moved(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(307)
            self.send_header("Location", f"{world.sandbox.url}/hooks/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Moved)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        world.endpoint(url=f"http://127.0.0.1:{server.server_address[1]}/in")
        world.refund_ended()
        [run] = world.deliver_all()
    finally:
        server.shutdown()
    assert run.outcome_code == "endpoint_refused"
    delivery = world.only_delivery()
    assert (delivery.status, delivery.last_status_code) == (DeliveryStatus.REFUSED, 307)
    assert world.received() == []


def test_an_endpoint_that_became_a_private_address_is_sent_nothing(world, settings):
    world.endpoint()
    world.refund_ended()
    settings.HOLDFAST_WEBHOOK_ALLOW_PRIVATE = False
    [run] = world.deliver_all()
    assert run.outcome_code == "private_address"
    delivery = world.only_delivery()
    assert delivery.status == DeliveryStatus.REFUSED
    assert "private or local network" in delivery.last_error
    assert world.received() == []

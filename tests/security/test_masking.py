"""One masking rule for addresses, card numbers and secrets: pages, the API, audit
entries and the admin all show values through it."""

from __future__ import annotations

import json

import pytest

from accounts.models import ApiToken, AuditEntry
from accounts.privacy import mask, mask_text
from accounts.services import audit_record
from agentruns.models import Step
from approvals.selectors import _rows
from tests.harness import Harness

pytestmark = pytest.mark.django_db(transaction=True)

ADDRESS = "grace.hopper@example.com"
CARD = "4242 4242 4242 4242"  # passes the Luhn check
ERROR = f"recipient refused: {{'{ADDRESS}': (550, b'no such user')}} card {CARD}"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"to {ADDRESS}", "to ••••@example.com"),
        (f"card {CARD} declined", "card •••• 4242 declined"),
        ("card 4242-4242-4242-4242", "card •••• 4242"),
        ("order 1234567890123 is not a card", "order 1234567890123 is not a card"),
        ("token hft_abcdefghijklmnopqrstuvwxyz012 used", "token •••• used"),
        ("its prefix hft_abcdefgh… names it", "its prefix hft_abcdefgh… names it"),
        ("key sk_live_51Habc123def456", "key ••••"),
        ("Authorization: Bearer abc.def-ghi", "Authorization: Bearer ••••"),
        ("nothing to hide", "nothing to hide"),
    ],
)
def test_the_rule_masks_addresses_cards_and_secrets_in_any_text(text, shown):
    assert mask_text(text) == shown


def test_the_rule_masks_sensitive_fields_by_name_at_any_depth():
    value = {
        "card_number": CARD,
        "amount": 4500,
        "customer": {"email": ADDRESS, "name": "Grace"},
        "notes": [f"write to {ADDRESS}"],
    }
    assert mask(value) == {
        "card_number": "••••",
        "amount": 4500,
        "customer": {"email": "••••", "name": "Grace"},
        "notes": ["write to ••••@example.com"],
    }


@pytest.fixture
def refused_step(tenant):
    harness = Harness(tenant)
    run = harness.start("flow", {})
    harness.advance(run)
    step = Step.objects.filter(run=run).first()
    Step.objects.filter(pk=step.pk).update(last_error=ERROR, last_error_class="invalid_request")
    return run, step


def test_an_error_text_is_masked_on_the_run_page_and_in_the_api(
    client, tenant, make_operator, refused_step
):
    run, _ = refused_step
    user = make_operator(tenant, "viewer", "operator")
    client.force_login(user)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert ADDRESS not in page and CARD not in page
    assert "••••@example.com" in page and "•••• 4242" in page
    _, secret = ApiToken.issue(owner=user, name="helpdesk")
    body = client.get(f"/api/runs/{run.id}", HTTP_AUTHORIZATION=f"Bearer {secret}").json()
    assert ADDRESS not in json.dumps(body) and CARD not in json.dumps(body)


def test_an_approval_cards_arguments_are_masked():
    rows = dict(_rows({"card_number": CARD, "amount": 4500, "currency": "eur", "to": ADDRESS}))
    assert rows == {
        "card_number": "••••",
        "amount": "45.00 EUR",
        "currency": "eur",
        "to": "••••@example.com",
    }


def test_an_audit_entry_never_holds_an_address_or_a_secret(tenant):
    entry = audit_record(
        tenant=tenant,
        actor="user:ann",
        action="case.resolve",
        object_type="case",
        object_id="1",
        before={"note": f"customer {ADDRESS} confirmed"},
        after={"api_key": "sk_live_51Habc123def456", "note": "ok"},
    )
    entry.refresh_from_db()
    assert entry.before == {"note": "customer ••••@example.com confirmed"}
    assert entry.after == {"api_key": "••••", "note": "ok"}
    assert AuditEntry.objects.filter(before__icontains=ADDRESS).count() == 0


def test_the_admin_shows_records_through_the_rule(admin_client, refused_step):
    _, step = refused_step
    page = admin_client.get(f"/admin/agentruns/step/{step.pk}/change/").content.decode()
    assert ADDRESS not in page and CARD not in page
    assert "••••@example.com" in page


def test_hashes_and_ids_are_never_taken_for_card_numbers():
    # A digit run inside a hex digest or an id can pass the Luhn check by chance.
    digest = "9f1c" + "4242424242424242" + "ab07"
    assert mask_text(digest) == digest
    assert mask_text("pi_4242424242424242") == "pi_4242424242424242"
    assert mask_text(f"hash {digest} card {CARD}") == f"hash {digest} card •••• 4242"


def test_a_flag_named_like_a_sensitive_field_is_shown():
    assert mask({"email_customer": False, "email": ADDRESS}) == {
        "email_customer": False,
        "email": "••••",
    }

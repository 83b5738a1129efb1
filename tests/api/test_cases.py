"""/api/v1/cases: reconciliation cases as their page shows them, and settling them."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection
from django.test import Client

from accounts.models import ApiToken, AuditEntry
from accounts.privacy import error_reference
from agentruns.models import Run, Step
from reconciliation.models import ProviderLookup, ReconciliationCase
from reconciliation.services import newest_lookup
from tests.harness import ORDER, ReconciliationWorld, point_at_sandbox, refund_harness

# Resolving wakes the run through the task queue (its own database on SQLite).
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture
def world(sandbox, settings, tenant) -> ReconciliationWorld:
    point_at_sandbox(settings, sandbox)
    order = sandbox.get(f"/shop/orders/{ORDER}").json()
    return ReconciliationWorld(refund_harness(tenant), sandbox, order, settings)


@pytest.fixture
def case(world) -> ReconciliationCase:
    """A refund whose outcome nobody knows: every send failed, and so did every lookup."""
    world.sandbox.arm("error_before", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    assert run.status == "effect_unknown_reconciliation_required"
    world.clear_faults()
    return world.case_of(run)


@pytest.fixture
def reconciler(tenant, make_operator):
    return make_operator(tenant, "reconciler", username="rita")


@pytest.fixture
def rita(api_as, reconciler):
    """Rita's helpdesk plug-in: a token of hers."""
    return api_as(reconciler)


def _seen(case: ReconciliationCase) -> dict:
    """What a caller who just read the case sends back."""
    case.refresh_from_db()
    newest = newest_lookup(case)
    return {"seen_version": case.version, "seen_observation_id": newest.pk if newest else None}


def _trail(case: ReconciliationCase) -> tuple:
    case.refresh_from_db()
    return case.status, case.version, case.lookups.count()


# --- reading --------------------------------------------------------------------------


def test_the_list_shows_open_cases_with_what_they_are(rita, case):
    response = rita.get("/cases", {"status": "open"})
    assert response.status_code == 200
    body = response.json()
    [item] = body["items"]
    assert body["next_cursor"] is None
    assert item["id"] == case.pk and item["status"] == "open"
    assert item["version"] == case.version
    assert item["tool"] == "issue_refund"
    assert item["provider"] == "payments (Stripe API)"
    assert item["effect_key"] == case.effect_key
    assert item["money"] == {"amount": 700, "currency": "eur", "display": "7.00 EUR"}
    assert item["run"]["id"] == str(case.run_id)
    assert item["run"]["status"] == "effect_unknown_reconciliation_required"


def test_the_list_filters_by_status_run_tool_and_provider(rita, case):
    def ids(**params):
        response = rita.get("/cases", params)
        assert response.status_code == 200, response.content
        return [item["id"] for item in response.json()["items"]]

    assert ids() == [case.pk]
    assert ids(status="resolved") == []
    assert ids(run=str(case.run_id), tool="issue_refund") == [case.pk]
    assert ids(run=str(uuid.uuid4())) == []
    assert ids(tool="send_email") == []
    assert ids(provider="payments (Stripe API)") == [case.pk]
    response = rita.get("/cases", {"status": "settled"})
    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["status"]


def test_reading_a_case_shows_what_its_page_shows(rita, case):
    response = rita.get(f"/cases/{case.pk}")
    assert response.status_code == 200
    body = response.json()
    assert body["version"] == case.version
    newest = newest_lookup(case)
    assert body["newest_observation_id"] == (newest.pk if newest else None)
    assert body["step"]["step_id"] == case.step_id_label
    assert body["step"]["status"] == "unknown"
    assert body["step"]["attempts"] >= 1
    assert body["effect_key"] == case.effect_key
    assert body["request"] == case.request and body["args"]["order_id"] == ORDER
    assert body["can_look_up"] is True
    assert body["attempts"] and all(entry["action"] for entry in body["attempts"])
    events = list(case.run.events.filter(step_id=case.step_id_label).order_by("id"))
    assert [event["type"] for event in body["events"]] == [event.type for event in events]
    assert len(body["observations"]) == case.lookups.count()
    choices = {choice["resolution"]: choice for choice in body["choices"]}
    assert sorted(choices) == ["cancel", "differently", "happened", "retry"]
    assert choices["cancel"]["allowed"] is False
    assert choices["cancel"]["why_not"] == "record a lookup showing it did not happen first"


def test_provider_errors_are_shown_by_the_error_rule(
    api_as, case, reconciler, tenant, make_operator
):
    words = "upstream db-7.internal refused the connection"
    Step.objects.filter(pk=case.step_id).update(last_error_class="server_error", last_error=words)
    ProviderLookup.objects.create(
        case=case,
        method="automatic",
        actor="system",
        outcome="inconclusive",
        evidence={"error": f"APIConnectionError: {words}"},
        note="the provider could not be asked",
    )
    reference = error_reference(f"APIConnectionError: {words}")
    viewer = api_as(make_operator(tenant, "viewer", username="vic")).get(f"/cases/{case.pk}")
    body = viewer.json()
    assert words not in str(body)
    assert body["step"]["error"] == f"the provider failed (reference {error_reference(words)})"
    last = body["observations"][-1]
    assert last["error"] == f"the call failed (reference {reference})"
    assert last["evidence"] is None  # the provider's words are in it
    body = api_as(reconciler).get(f"/cases/{case.pk}").json()
    assert body["step"]["error"] == f"{words} (reference {error_reference(words)})"
    last = body["observations"][-1]
    assert words in last["error"] and reference in last["error"]
    assert words in last["evidence"]["error"]


def test_another_tenants_case_is_never_found(api_as, case, other_tenant, make_operator):
    stranger = api_as(make_operator(other_tenant, "admin", username="olaf"))
    assert stranger.get("/cases").json()["items"] == []
    assert stranger.get(f"/cases/{case.pk}").json() == {"error": f"no case {case.pk}"}
    before = _trail(case)
    seen = _seen(case)
    for path, body in [
        ("lookup", seen),
        ("observations", {**seen, "outcome": "not_found", "note": "looked"}),
        ("resolution", {**seen, "resolution": "cancel"}),
    ]:
        assert stranger.post(f"/cases/{case.pk}/{path}", body).status_code == 404
    assert _trail(case) == before


# --- looking up -----------------------------------------------------------------------


def test_a_lookup_asks_the_provider_and_settles_what_it_can(rita, case):
    response = rita.post(f"/cases/{case.pk}/lookup", _seen(case))
    assert response.status_code == 201, response.content
    body = response.json()
    # Every send failed before reaching the provider: no refund under the key.
    assert body["observation"]["outcome"] == "not_found"
    assert body["observation"]["method"] == "automatic"
    assert body["observation"]["actor"] == "user:rita"
    assert body["case"]["status"] == "resolved" and body["case"]["resolution"] == "retry"
    entry = AuditEntry.objects.get(action="case.lookup.automatic", actor="user:rita")
    assert entry.object_id == str(case.pk)
    token = ApiToken.objects.get(owner__username="rita")
    assert entry.after["token"] == f"token:{token.name} ({token.prefix}…)"


def test_a_lookup_on_a_stale_version_is_409_and_asks_nobody(rita, case, world):
    seen = _seen(case)
    ProviderLookup.objects.create(
        case=case, method="operator", actor="user:bea", outcome="not_found", note="looked"
    )
    bumped = seen["seen_version"] + 1
    ReconciliationCase.objects.filter(pk=case.pk).update(version=bumped)
    before = _trail(case)
    asked = world.sandbox.stats()
    response = rita.post(f"/cases/{case.pk}/lookup", seen)
    assert response.status_code == 409
    body = response.json()
    assert body["error"].startswith("the case changed since you read it")
    assert body["version"] == bumped
    assert body["newest_observation_id"] == newest_lookup(case).pk
    assert body["case"]["status"] == "open" and body["case"]["version"] == bumped
    assert _trail(case) == before
    assert world.sandbox.stats() == asked
    assert not AuditEntry.objects.filter(object_type="case").exists()


# --- recording what was found -----------------------------------------------------------


def test_an_observation_is_recorded_and_audited(rita, case):
    seen = _seen(case)
    response = rita.post(
        f"/cases/{case.pk}/observations",
        {**seen, "outcome": "not_found", "note": "no refund in the dashboard for the key"},
    )
    assert response.status_code == 201, response.content
    body = response.json()
    observation = body["observation"]
    assert observation["outcome"] == "not_found" and observation["method"] == "operator"
    assert observation["actor"] == "user:rita" and observation["conclusive"] is True
    assert body["case"]["version"] == seen["seen_version"] + 1
    assert body["case"]["newest_observation_id"] == observation["id"]
    choices = {choice["resolution"]: choice for choice in body["case"]["choices"]}
    assert choices["cancel"]["allowed"] is True and choices["retry"]["allowed"] is True
    entry = AuditEntry.objects.get(action="case.lookup.operator")
    assert entry.actor == "user:rita" and entry.after["lookup"] == observation["id"]
    assert entry.after["token"].startswith("token:t (")


def test_a_found_refund_is_recorded_with_its_amount(rita, case):
    response = rita.post(
        f"/cases/{case.pk}/observations",
        {
            **_seen(case),
            "outcome": "differently",
            "note": "a refund of 5.00 under the key",
            "provider_reference": "re_123",
            "observed_amount": 500,
        },
    )
    assert response.status_code == 201
    observed = response.json()["observation"]["observed"]
    assert observed == {"amount": 500, "currency": "eur", "display": "5.00 EUR"}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"outcome": "succeeded", "note": "found it"}, "provider_reference"),
        ({"outcome": "differently", "note": "x", "provider_reference": "re_1"}, "observed_amount"),
        ({"outcome": "maybe", "note": "x"}, "outcome"),
        ({"outcome": "not_found", "note": ""}, "note"),
        ({"outcome": "not_found", "note": "x", "observed_amount": -5}, "observed_amount"),
        ({"outcome": "not_found", "note": "x", "observed_currency": "euro"}, "observed_currency"),
    ],
)
def test_a_wrong_observation_is_400_naming_the_field_and_records_nothing(rita, case, fields, field):
    before = _trail(case)
    response = rita.post(f"/cases/{case.pk}/observations", {**_seen(case), **fields})
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert _trail(case) == before


def test_what_was_seen_must_be_sent(rita, case):
    response = rita.post(f"/cases/{case.pk}/observations", {"outcome": "not_found", "note": "x"})
    assert response.status_code == 400
    assert sorted(response.json()["errors"]) == ["seen_observation_id", "seen_version"]


def test_an_observation_on_a_stale_version_is_409_and_records_nothing(rita, case):
    seen = _seen(case)
    body = {**seen, "outcome": "not_found", "note": "no refund"}
    assert rita.post(f"/cases/{case.pk}/observations", body).status_code == 201
    before = _trail(case)
    response = rita.post(f"/cases/{case.pk}/observations", body)
    assert response.status_code == 409
    assert response.json()["version"] == seen["seen_version"] + 1
    assert _trail(case) == before


# --- resolving ------------------------------------------------------------------------


def _found_nothing(rita, case) -> dict:
    body = {**_seen(case), "outcome": "not_found", "note": "no refund under the key"}
    assert rita.post(f"/cases/{case.pk}/observations", body).status_code == 201
    return _seen(case)


def test_resolving_settles_the_case_and_the_run(rita, case, world):
    seen = _found_nothing(rita, case)
    response = rita.post(
        f"/cases/{case.pk}/resolution",
        {**seen, "resolution": "cancel", "note": "the customer was refunded by hand"},
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "resolved" and body["resolution"] == "cancel"
    assert body["resolved_by"] == "user:rita"
    assert body["resolution_note"] == "the customer was refunded by hand"
    assert body["choices"] == []
    run = Run.objects.get(pk=case.run_id)
    assert run.status.startswith("cancelled")
    assert world.refunds()["count"] == 0
    entry = AuditEntry.objects.get(action="case.resolve.cancel")
    assert entry.actor == "user:rita" and entry.after["token"].startswith("token:t (")
    again = rita.post(f"/cases/{case.pk}/resolution", {**seen, "resolution": "cancel"})
    assert again.status_code == 409
    assert again.json()["error"] == "user:rita already resolved this case"
    assert again.json()["case"]["resolved_by"] == "user:rita"


def test_a_resolution_on_stale_evidence_is_409_and_changes_nothing(rita, case, api_as, tenant):
    seen = _seen(case)
    _found_nothing(rita, case)  # newer evidence, recorded by someone else meanwhile
    before = _trail(case)
    response = rita.post(f"/cases/{case.pk}/resolution", {**seen, "resolution": "cancel"})
    assert response.status_code == 409
    body = response.json()
    assert body["version"] == seen["seen_version"] + 1
    assert body["newest_observation_id"] == newest_lookup(case).pk
    assert _trail(case) == before
    assert Run.objects.get(pk=case.run_id).status == "effect_unknown_reconciliation_required"
    assert not AuditEntry.objects.filter(action__startswith="case.resolve").exists()


def test_a_resolution_the_evidence_does_not_allow_is_400(rita, case):
    seen = _found_nothing(rita, case)
    before = _trail(case)
    response = rita.post(f"/cases/{case.pk}/resolution", {**seen, "resolution": "happened"})
    assert response.status_code == 400
    assert "record a lookup that found it first" in response.json()["error"]
    assert _trail(case) == before


def test_settling_needs_the_scope_and_the_permission(
    api_as, reconciler, case, tenant, make_operator
):
    seen = _seen(case)
    before = _trail(case)
    reader = api_as(reconciler, scopes=[ApiToken.SCOPE_CASES_READ])
    response = reader.post(f"/cases/{case.pk}/lookup", seen)
    assert response.status_code == 403
    assert response.json() == {"error": "this token may not do cases:settle"}
    viewer = api_as(make_operator(tenant, "viewer", username="vic"))
    assert viewer.get(f"/cases/{case.pk}").status_code == 200
    for path in ("lookup", "observations", "resolution"):
        response = viewer.post(f"/cases/{case.pk}/{path}", seen)
        assert response.status_code == 403
        assert "vic" in response.json()["error"]
    assert _trail(case) == before


def test_a_resolution_through_the_api_racing_one_through_the_page_leaves_one(
    rita, case, tenant, make_operator
):
    seen = _found_nothing(rita, case)
    page = Client()
    page.force_login(make_operator(tenant, "reconciler", username="rob"))
    barrier = threading.Barrier(2)
    answers: dict[str, int] = {}

    def through_the_api() -> None:
        try:
            barrier.wait(timeout=10)
            body = {**seen, "resolution": "cancel", "note": "by rita"}
            answers["api"] = rita.post(f"/cases/{case.pk}/resolution", body).status_code
        finally:
            connection.close()

    def through_the_page() -> None:
        try:
            form = {
                "resolution": "retry",
                "seen_version": seen["seen_version"],
                "seen_lookup_id": seen["seen_observation_id"],
                "note": "by rob",
            }
            barrier.wait(timeout=10)
            answers["page"] = page.post(f"/reconciliation/{case.pk}/resolve", form).status_code
        finally:
            connection.close()

    threads = [threading.Thread(target=through_the_api), threading.Thread(target=through_the_page)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    case.refresh_from_db()
    assert case.status == "resolved"
    if case.resolved_by == "user:rita":
        assert case.resolution == "cancel" and answers == {"api": 200, "page": 409}
    else:
        assert case.resolved_by == "user:rob"
        assert case.resolution == "retry" and answers == {"api": 409, "page": 302}
    assert AuditEntry.objects.filter(action__startswith="case.resolve").count() == 1

"""The refund agent says how its run ended: refunded, refund refused, nothing to refund."""

from __future__ import annotations

import pytest

from accounts.models import ApiToken
from tests.harness import point_at_sandbox, refund_harness

pytestmark = pytest.mark.django_db(transaction=True)

ORDER = "ord_1001"


@pytest.fixture
def world(sandbox, settings, tenant):
    point_at_sandbox(settings, sandbox)
    return refund_harness(tenant), sandbox


@pytest.fixture
def viewer(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "viewer"))
    return client


def test_a_refund_that_went_through_ends_refunded(world):
    harness, _ = world
    run = harness.start("refund_support", {"order_id": ORDER, "amount": 1500})
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.outcome_code == "refunded"
    assert run.outcome_detail.startswith("refund re_")


def test_a_refused_refund_ends_completed_refund_refused_in_the_list_the_page_and_the_api(
    world, viewer, tenant, make_operator
):
    harness, sandbox = world
    # No approval step in the way: the provider itself refuses more than was paid.
    tenant.agent_config = {"refund_support": {"approvals": {"enabled": False}}}
    tenant.save()
    run = harness.start("refund_support", {"order_id": ORDER, "amount": 9_999_999})
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert (run.status, run.outcome_code) == ("completed", "refund_refused")
    assert sandbox.stats()["refunds"]["total"] == 0

    page = viewer.get(f"/runs/{run.id}/").content.decode()
    assert '>Completed<span class="visually-hidden">' in page
    assert '</span></span> <span class="outcome">· refund refused</span>' in page
    listed = viewer.get("/runs/").content.decode()
    assert "· refund refused</a>" in listed
    filtered = viewer.get("/runs/?outcome=refund_refused").content.decode()
    assert f"run-{run.id}" in filtered
    assert f"run-{run.id}" not in viewer.get("/runs/?outcome=refunded").content.decode()

    owner = make_operator(tenant, "viewer", "operator", username="integrator")
    _, secret = ApiToken.issue(owner=owner, name="helpdesk")
    body = viewer.get(f"/api/runs/{run.id}", HTTP_AUTHORIZATION=f"Bearer {secret}").json()
    assert (body["status"], body["outcome_code"]) == ("completed", "refund_refused")


def test_an_order_that_cannot_be_found_ends_nothing_to_refund(world):
    harness, sandbox = world
    run = harness.start("refund_support", {"order_id": "ord_missing", "amount": 1500})
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.outcome_code == "nothing_to_refund"
    assert sandbox.stats()["refunds"]["total"] == 0

"""The run list and the run detail pages: login, tenant scoping, permissions, escaping."""

from __future__ import annotations

import pytest

from agentruns.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def viewer(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "viewer"))
    return client


def test_the_pages_require_login(client, harness):
    run = harness.start("flow")
    for url in ["/runs/", f"/runs/{run.id}/"]:
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")


def test_a_login_that_is_no_operator_is_refused_with_a_clear_page(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("drifter", password="x"))
    response = client.get("/runs/")
    assert response.status_code == 403
    assert b"not an operator of any tenant" in response.content


def test_the_list_shows_the_tenants_runs_by_state(viewer, harness, provider):
    done = harness.start("flow")
    harness.advance(done)
    waiting = harness.start("flow", {"sleep": 600})
    harness.advance(waiting)
    page = viewer.get("/runs/").content.decode()
    assert f"run-{done.id}" in page and f"run-{waiting.id}" in page
    completed_only = viewer.get("/runs/?state=completed").content.decode()
    assert f"run-{done.id}" in completed_only and f"run-{waiting.id}" not in completed_only
    assert 'Completed <span class="count">1</span>' in page
    assert 'Sleeping <span class="count">1</span>' in page


def test_counts_stop_at_the_cap_and_say_so(viewer, harness, monkeypatch):
    from agentruns import selectors

    monkeypatch.setattr(selectors, "COUNT_CAP", 2)
    for _ in range(3):
        harness.start("flow")
    page = viewer.get("/runs/").content.decode()
    assert 'Queued <span class="count">2+</span>' in page
    assert 'Working <span class="count">2+</span>' in page  # its group says so too
    assert 'All <span class="count">2+</span>' in page
    harness.advance(harness.start("flow"))
    page = viewer.get("/runs/").content.decode()
    assert 'Completed <span class="count">1</span>' in page


def test_another_tenants_runs_are_invisible(client, harness, other_tenant, make_operator):
    run = harness.start("flow")
    client.force_login(make_operator(other_tenant, "viewer"))
    assert str(run.id) not in client.get("/runs/").content.decode()
    assert client.get(f"/runs/{run.id}/").status_code == 404


def test_search_finds_runs_by_request_id_order_id_and_effect_key(viewer, harness):
    run = harness.start("flow", {"order_id": "o-77"}, request_id="ticket-9")
    harness.advance(run)
    other = harness.start("flow", {"order_id": "o-78"})
    key = run.steps.get(name="charge").effect_key
    for query in ["ticket-9", "o-77", key, str(run.id)]:
        page = viewer.get("/runs/", {"q": query}).content.decode()
        assert f"run-{run.id}" in page, query
        assert f"run-{other.id}" not in page, query


def test_the_list_pages_by_keyset(viewer, harness, monkeypatch):
    monkeypatch.setattr("agentruns.selectors.PAGE_SIZE", 2)
    runs = [harness.start("flow", {"order_id": f"o-{i}"}) for i in range(5)]
    first = viewer.get("/runs/")
    cursor = first.context["next_cursor"]
    assert [r.id for r in first.context["runs"]] == [r.id for r in runs[::-1][:2]]
    second = viewer.get("/runs/", {"after": cursor})
    assert [r.id for r in second.context["runs"]] == [r.id for r in runs[::-1][2:4]]


def test_an_empty_list_explains_itself(viewer):
    assert b"No runs yet" in viewer.get("/runs/").content
    assert b"No run is in the state" in viewer.get("/runs/?state=blocked").content
    assert b"No run matches these filters" in viewer.get("/runs/?q=nothing").content


def test_htmx_gets_the_table_fragment(viewer, harness):
    harness.start("flow")
    response = viewer.get("/runs/", HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="run-table">')
    assert "<html" not in body


def test_the_detail_shows_the_timeline_with_effect_keys_and_evidence(viewer, harness):
    run = harness.start("support", {"scenario": "refund"})
    harness.advance(run)
    page = viewer.get(f"/runs/{run.id}/").content.decode()
    charge = run.steps.get(name="charge")
    assert "0001.tool.lookup_order" in page
    assert charge.effect_key in page and charge.provider_reference in page
    assert "scripted scripted-1" in page  # model evidence
    assert "step_succeeded" in page  # the event log


def test_model_output_is_escaped(viewer, harness):
    run = harness.start("flow")
    Run.objects.filter(pk=run.id).update(outcome_detail="<script>alert(1)</script>")
    page = viewer.get(f"/runs/{run.id}/").content.decode()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_times_are_shown_in_the_operators_time_zone(client, tenant, make_operator, harness):
    client.force_login(make_operator(tenant, "viewer", time_zone="Asia/Tokyo"))
    run = harness.start("flow")
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "JST" in page


def test_the_list_and_detail_refuse_post(viewer, harness):
    run = harness.start("flow")
    assert viewer.post("/runs/").status_code == 405
    assert viewer.post(f"/runs/{run.id}/").status_code == 405


def test_sensitive_fields_are_masked_in_step_payloads(viewer, harness):
    run = harness.start("mailer")
    harness.advance(run)
    page = viewer.get(f"/runs/{run.id}/").content.decode()
    assert "a@example.com" not in page  # the "to" of an email is an address…
    step = run.steps.get(name="send_email")
    assert step.input["to"] == "a@example.com"


def test_the_payload_filter_masks_by_key_and_shortens_large_values():
    from agentruns.templatetags.runs import payload

    shown = payload({"customer": {"email": "x@y.z", "name": "Ann"}, "api_key": "sk_live_1"})
    assert "x@y.z" not in shown and "sk_live_1" not in shown and "Ann" in shown
    assert "more characters" in payload({"rows": ["x" * 100] * 100})

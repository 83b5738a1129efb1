"""The admin shows runs and steps read-only until the dashboard exists."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def test_runs_and_steps_can_be_inspected_in_the_admin(admin_client, harness):
    run = harness.start("flow")
    harness.advance(run)
    for url in [
        "/admin/agentruns/run/",
        f"/admin/agentruns/run/{run.id}/change/",
        "/admin/agentruns/step/",
        "/admin/agentruns/runevent/",
    ]:
        response = admin_client.get(url)
        assert response.status_code == 200, url
    page = admin_client.get(f"/admin/agentruns/run/{run.id}/change/").content.decode()
    assert "0001.tool.charge" in page


def test_the_admin_does_not_let_anyone_edit_engine_rows(admin_client, harness):
    run = harness.start("flow")
    assert admin_client.get("/admin/agentruns/run/add/").status_code == 403
    response = admin_client.post(f"/admin/agentruns/run/{run.id}/change/", {"status": "completed"})
    assert response.status_code == 403


def test_the_admin_requires_login(client):
    response = client.get("/admin/agentruns/run/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]

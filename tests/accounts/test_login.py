from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_an_operator_logs_in_and_lands_on_the_runs(client, tenant, make_operator):
    make_operator(tenant, "viewer", username="ann")
    assert client.get("/accounts/login/").status_code == 200
    response = client.post(
        "/accounts/login/", {"username": "ann", "password": "correct horse battery"}
    )
    assert response.status_code == 302 and response["Location"] == "/runs/"
    assert client.get("/runs/").status_code == 200


def test_a_wrong_password_is_explained(client, tenant, make_operator):
    make_operator(tenant, "viewer", username="ann")
    response = client.post("/accounts/login/", {"username": "ann", "password": "nope"})
    assert response.status_code == 200
    assert b"did not match" in response.content


def test_logging_out_takes_a_post(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "viewer"))
    response = client.post("/accounts/logout/")
    assert response.status_code == 302
    assert client.get("/runs/").status_code == 302


def test_the_groups_carry_their_permissions(django_user_model, tenant, make_operator):
    approver = make_operator(tenant, "approver")
    assert approver.has_perm("accounts.decide_approvals")
    assert not approver.has_perm("accounts.cancel_runs")
    admin = make_operator(tenant, "admin")
    assert admin.has_perm("accounts.settle_effects") and admin.has_perm("accounts.view_audit")

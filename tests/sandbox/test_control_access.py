"""The sandbox's control routes answer only its token holder, never another site's page.

A page on any site can make the developer's browser send simple requests to
127.0.0.1: a GET, or a POST with a ``text/plain`` body. Every ``/_sandbox/`` route asks
for ``Authorization: Bearer <control token>`` and every POST and DELETE for a JSON
content type, which a browser sends cross-origin only after a preflight the sandbox
never approves.
"""

from __future__ import annotations

import json

import pytest
import requests

from tests.harness import API_KEY

EVIL_ORIGIN = "https://attacker.example"
CONTROL_ROUTES = [
    ("GET", "/_sandbox/stats"),
    ("GET", "/_sandbox/requests"),
    ("GET", "/_sandbox/messages"),
    ("GET", "/_sandbox/webhooks"),
    ("GET", "/_sandbox/faults"),
    ("POST", "/_sandbox/faults"),
    ("DELETE", "/_sandbox/faults"),
    ("POST", "/_sandbox/reset"),
    ("POST", "/_sandbox/seed"),
    ("GET", "/_sandbox/clock"),
    ("POST", "/_sandbox/clock"),
    # No route: still 401, so nobody without the token learns which routes exist.
    ("GET", "/_sandbox/nothing-here"),
]


def browser_request(sandbox, method: str, path: str, **headers: str) -> requests.Response:
    """What another site's page can send: a simple request, a text/plain body."""
    return requests.request(
        method,
        sandbox.url + path,
        data=json.dumps({"kind": "drop_after_commit", "count": 5, "seed": True}),
        headers={"Origin": EVIL_ORIGIN, "Content-Type": "text/plain", **headers},
        timeout=10,
    )


def armed(sandbox) -> list[dict]:
    return sandbox.get("/_sandbox/faults").json()["faults"]


def test_a_cross_origin_text_plain_post_without_the_token_is_401_and_arms_nothing(sandbox):
    answer = browser_request(sandbox, "POST", "/_sandbox/faults")

    assert answer.status_code == 401
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.headers["WWW-Authenticate"] == 'Bearer realm="sandbox"'
    assert answer.json()["error"]["type"] == "authentication_error"
    assert "Authorization: Bearer" in answer.json()["error"]["message"]
    assert not any(name.lower().startswith("access-control-") for name in answer.headers)
    assert armed(sandbox) == []


def test_a_post_with_the_token_but_text_plain_is_415_and_arms_nothing(sandbox):
    answer = browser_request(
        sandbox, "POST", "/_sandbox/faults", Authorization=f"Bearer {sandbox.control_token}"
    )

    assert answer.status_code == 415
    assert answer.headers["Content-Type"] == "application/json"
    assert "Content-Type: application/json" in answer.json()["error"]["message"]
    assert armed(sandbox) == []


def test_a_reset_with_the_token_but_text_plain_keeps_every_record(sandbox):
    sandbox.arm("delay")

    answer = browser_request(
        sandbox, "POST", "/_sandbox/reset", Authorization=f"Bearer {sandbox.control_token}"
    )

    assert answer.status_code == 415
    assert [fault["kind"] for fault in armed(sandbox)] == ["delay"]
    assert sandbox.order("ord_1001")["id"] == "ord_1001"


def test_a_delete_without_a_json_content_type_is_415(sandbox):
    sandbox.arm("delay")

    answer = requests.delete(
        sandbox.url + "/_sandbox/faults",
        headers={"Authorization": f"Bearer {sandbox.control_token}"},
        timeout=10,
    )

    assert answer.status_code == 415
    assert len(armed(sandbox)) == 1


def test_a_preflight_gets_no_cors_headers(sandbox):
    answer = requests.options(
        sandbox.url + "/_sandbox/faults",
        headers={
            "Origin": EVIL_ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
        timeout=10,
    )

    assert answer.status_code == 405
    assert answer.headers["Allow"] == "GET, POST, DELETE"
    assert not any(name.lower().startswith("access-control-") for name in answer.headers)


@pytest.mark.parametrize(("method", "path"), CONTROL_ROUTES)
@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer", "Bearer wrong-token", f"Bearer {API_KEY}", "Basic c2J4Og=="],
    ids=["none", "empty", "wrong", "api-key", "basic"],
)
def test_every_control_route_refuses_a_request_without_the_token(
    sandbox_process, method, path, authorization
):
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization

    answer = requests.request(
        method, sandbox_process.url + path, json={}, headers=headers, timeout=10
    )

    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["type"] == "authentication_error"


def test_a_token_of_the_right_length_but_wrong_is_refused(sandbox):
    wrong = "x" * len(sandbox.control_token)
    answer = requests.get(
        sandbox.url + "/_sandbox/stats", headers={"Authorization": f"Bearer {wrong}"}, timeout=10
    )
    assert answer.status_code == 401


def test_the_token_holder_reads_with_a_plain_get_and_writes_with_json(sandbox):
    bearer = {"Authorization": f"Bearer {sandbox.control_token}"}

    stats = requests.get(sandbox.url + "/_sandbox/stats", headers=bearer, timeout=10)
    armed_now = requests.post(
        sandbox.url + "/_sandbox/faults",
        data=json.dumps({"kind": "delay", "path": "/shop/"}),
        headers={**bearer, "Content-Type": "application/json; charset=utf-8"},
        timeout=10,
    )

    assert stats.status_code == 200
    assert armed_now.status_code == 200, armed_now.text
    assert [fault["kind"] for fault in armed(sandbox)] == ["delay"]


def test_the_provider_routes_keep_their_api_key_and_ask_for_no_control_token(sandbox):
    answer = requests.get(
        sandbox.url + "/shop/orders/ord_1001",
        headers={"Authorization": f"Bearer {API_KEY}", "Origin": EVIL_ORIGIN},
        timeout=10,
    )
    assert answer.status_code == 200
    assert not any(name.lower().startswith("access-control-") for name in answer.headers)

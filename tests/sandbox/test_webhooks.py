"""The incoming webhook: one delivery per Idempotency-Key, and a lookup by key."""

from __future__ import annotations

import json

import requests


def _post(sandbox, channel: str, body, key: str = "") -> requests.Response:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = key
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(f"{sandbox.url}/hooks/{channel}", data=data, headers=headers, timeout=10)


def test_a_message_posted_again_under_its_key_is_delivered_once(sandbox):
    first = _post(sandbox, "ops", {"text": "an approval waits"}, key="k1")
    again = _post(sandbox, "ops", {"text": "an approval waits"}, key="k1")

    assert first.status_code == again.status_code == 200
    assert first.json()["replayed"] is False and again.json()["replayed"] is True
    assert first.json()["delivery"] == again.json()["delivery"]
    stats = sandbox.stats()["webhooks"]
    assert stats == {"total": 1, "by_channel": {"ops": 1}, "by_idempotency_key": {"k1": 1}}


def test_without_a_key_each_post_is_a_delivery(sandbox):
    for _ in range(2):
        assert _post(sandbox, "ops", {"text": "hello"}).status_code == 200
    assert sandbox.stats()["webhooks"]["total"] == 2


def test_a_delivery_is_found_by_its_key_and_only_on_its_channel(sandbox):
    posted = _post(sandbox, "ops", {"text": "hello"}, key="k2").json()

    found = requests.get(f"{sandbox.url}/hooks/ops/deliveries/k2", timeout=10)
    assert found.status_code == 200 and found.json()["delivery"] == posted["delivery"]
    for path in ("/hooks/ops/deliveries/other", "/hooks/elsewhere/deliveries/k2"):
        missing = requests.get(sandbox.url + path, timeout=10)
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "no_delivery"


def test_a_body_that_is_not_a_message_is_refused_and_not_delivered(sandbox):
    assert _post(sandbox, "ops", b"not json", key="k3").status_code == 400
    assert _post(sandbox, "ops", {"blocks": []}, key="k3").status_code == 400
    assert sandbox.stats()["webhooks"]["total"] == 0


def test_a_lost_reply_still_delivered_and_the_resend_is_a_replay(sandbox):
    sandbox.arm("drop_after_commit", path="/hooks/ops", method="POST")
    try:
        _post(sandbox, "ops", {"text": "hello"}, key="k4")
    except requests.ConnectionError:
        pass
    else:
        raise AssertionError("the reply was not dropped")
    again = _post(sandbox, "ops", {"text": "hello"}, key="k4")
    assert again.json()["replayed"] is True
    assert sandbox.stats()["webhooks"]["by_idempotency_key"] == {"k4": 1}


def test_a_standard_webhooks_post_is_kept_as_sent_and_deduplicated_by_its_id(sandbox):
    body = b'{"data":{"id":"r1"},"type":"run.ended"}'
    headers = {
        "Content-Type": "application/json",
        "webhook-id": "msg_1",
        "webhook-timestamp": "1764547200",
        "webhook-signature": "v1,c2lnbmF0dXJl v1,b2xkZXI=",
    }
    url = f"{sandbox.url}/hooks/crm"
    first = requests.post(url, data=body, headers=headers, timeout=10)
    again = requests.post(url, data=body, headers=headers, timeout=10)
    assert first.status_code == again.status_code == 200
    assert (first.json()["replayed"], again.json()["replayed"]) == (False, True)
    [delivery] = sandbox.get("/_sandbox/webhooks").json()["deliveries"]
    assert delivery["idempotency_key"] == "msg_1"
    assert delivery["raw_body"] == body.decode()
    assert delivery["timestamp"] == "1764547200"
    assert delivery["signature"] == "v1,c2lnbmF0dXJl v1,b2xkZXI="
    # Any JSON object is an event; a body that is not one is refused.
    refused = requests.post(
        url, data=b"[1]", headers={**headers, "webhook-id": "msg_2"}, timeout=10
    )
    assert refused.status_code == 400
    assert sandbox.stats()["webhooks"]["total"] == 1

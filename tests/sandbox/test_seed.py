"""Seeding an account: POST /_sandbox/seed and /_sandbox/reset with an API key and the
number its orders start from; ids are global, so an id another account holds is refused."""

from __future__ import annotations

from sandbox.accounts import account_for
from tests.harness import API_KEY

OTHER_KEY = "sk_test_other"


def seed_other(sandbox, first_number: int = 2001):
    return sandbox.post("/_sandbox/seed", json={"api_key": OTHER_KEY, "first_number": first_number})


def test_by_default_it_seeds_ord_1001_to_1006_in_the_demo_account(sandbox):
    seeded = sandbox.post("/_sandbox/seed").json()
    assert seeded == {
        "seeded": [f"ord_{n}" for n in range(1001, 1007)],
        "account": account_for(API_KEY),
    }
    assert sandbox.order("ord_1006")["payment_intent"] == "pi_3SbxOrd1006"


def test_a_second_account_gets_its_own_numbers_and_ids(sandbox):
    answer = seed_other(sandbox)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "seeded": [f"ord_{n}" for n in range(2001, 2007)],
        "account": account_for(OTHER_KEY),
    }

    order = sandbox.order("ord_2001", api_key=OTHER_KEY)
    assert order["customer"] == {"name": "Ada Lovelace", "email": "ada@example.com"}
    assert order["payment_intent"] == "pi_3SbxOrd2001"
    intent = sandbox.client(OTHER_KEY).v1.payment_intents.retrieve("pi_3SbxOrd2001")
    assert (intent.amount, intent.latest_charge, intent.customer) == (
        8900,
        "ch_3SbxOrd2001",
        "cus_SbxCust2001",
    )
    assert intent.metadata.to_dict() == {"order_id": "ord_2001"}


def test_two_accounts_cannot_see_each_others_orders_or_payments(sandbox):
    seed_other(sandbox)
    for key, own, others in ((API_KEY, 1001, 2001), (OTHER_KEY, 2001, 1001)):
        assert sandbox.get(f"/shop/orders/ord_{own}", api_key=key).status_code == 200
        assert sandbox.get(f"/shop/orders/ord_{others}", api_key=key).status_code == 404
        assert sandbox.get(f"/v1/payment_intents/pi_3SbxOrd{own}", api_key=key).ok
        others_intent = sandbox.get(f"/v1/payment_intents/pi_3SbxOrd{others}", api_key=key)
        assert others_intent.status_code == 404


def test_seeding_again_changes_nothing(sandbox):
    first = seed_other(sandbox).json()
    assert seed_other(sandbox).json() == first


def test_seeding_an_id_that_another_account_holds_is_refused_whole(sandbox):
    # ord_998 to ord_1000 are free; ord_1001 and its payment intent are the demo account's.
    answer = seed_other(sandbox, first_number=998)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "first_number"
    assert error["message"] == (
        "The payment intent pi_3SbxOrd1001 belongs to another account: seed this one "
        "from another first_number."
    )
    for number in (998, 999, 1000):
        assert sandbox.get(f"/shop/orders/ord_{number}", api_key=OTHER_KEY).status_code == 404
    assert sandbox.order("ord_1001")["payment_intent"] == "pi_3SbxOrd1001"


def test_reset_seeds_the_account_it_is_given(sandbox):
    answer = sandbox.post(
        "/_sandbox/reset", json={"seed": True, "api_key": OTHER_KEY, "first_number": 2001}
    )
    assert answer.json() == {
        "reset": True,
        "seeded": [f"ord_{n}" for n in range(2001, 2007)],
        "account": account_for(OTHER_KEY),
    }
    assert sandbox.get("/shop/orders/ord_1001").status_code == 404
    assert sandbox.order("ord_2003", api_key=OTHER_KEY)["amount"] == 24900


def test_a_refused_reset_leaves_everything_as_it_was(sandbox):
    for body, param in (
        ({"seed": True, "first_number": 0}, "first_number"),
        ({"seed": True, "first_number": "2001"}, "first_number"),
        ({"seed": True, "api_key": ""}, "api_key"),
        ({"seed": True, "api_key": None}, "api_key"),
    ):
        answer = sandbox.post("/_sandbox/reset", json=body)
        assert answer.status_code == 400, body
        assert answer.json()["error"]["param"] == param
    assert sandbox.order("ord_1001")["id"] == "ord_1001"

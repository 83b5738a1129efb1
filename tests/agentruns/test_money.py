"""Amounts in minor units as operators read and type them."""

from __future__ import annotations

import pytest

from agentruns.money import format_amount, parse_amount


@pytest.mark.parametrize(
    ("amount", "currency", "shown"),
    [
        (700, "eur", "7.00 EUR"),
        (123456, "usd", "1,234.56 USD"),
        (700, "jpy", "700 JPY"),
        (None, "eur", "—"),
    ],
)
def test_amounts_are_shown_with_the_currencys_own_decimals(amount, currency, shown):
    assert format_amount(amount, currency) == shown


@pytest.mark.parametrize(
    ("typed", "currency", "minor"),
    [
        ("7.00", "eur", 700),
        ("1,250.5", "eur", 125050),
        ("7", "eur", 700),
        ("700", "jpy", 700),
        ("", "eur", None),
    ],
)
def test_typed_amounts_become_minor_units(typed, currency, minor):
    assert parse_amount(typed, currency) == minor


@pytest.mark.parametrize(
    ("typed", "currency"),
    [("seven", "eur"), ("7.001", "eur"), ("7.5", "jpy"), ("-1", "eur"), ("NaN", "eur")],
)
def test_what_is_not_an_amount_is_refused_with_a_reason(typed, currency):
    with pytest.raises(ValueError, match="amount"):
        parse_amount(typed, currency)


def test_a_change_of_state_shows_amounts_as_money_in_the_states_currency():
    from agentruns.money import state_changes

    before = {"currency": "eur", "amount_received": 4500, "amount_refunded": 0, "status": "ok"}
    after = {**before, "amount_refunded": 500, "status": "partly refunded"}
    assert state_changes(before, after) == [
        "amount_refunded: 0.00 EUR → 5.00 EUR",
        "status: ok → partly refunded",
    ]
    assert state_changes(
        {"amount": 8000, "currency": "jpy"}, {"amount": 7000, "currency": "jpy"}
    ) == ["amount: 8,000 JPY → 7,000 JPY"]
    # No currency, no unit to show: the value as it is.
    assert state_changes({"amount_refunded": 0}, {"amount_refunded": 500}) == [
        "amount_refunded: 0 → 500"
    ]

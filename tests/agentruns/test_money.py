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

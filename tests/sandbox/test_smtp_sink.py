"""The SMTP sink stores every accepted message as the mail provider's record."""

from __future__ import annotations

import smtplib
from email.message import EmailMessage as StdlibMessage

from django.core.mail import EmailMessage, get_connection


def test_it_stores_a_message_sent_with_smtplib(sandbox):
    message = StdlibMessage()
    message["From"] = "support@holdfast.example"
    message["To"] = "ada@example.com, grace@example.com"
    message["Subject"] = "Your refund"
    message["Message-ID"] = "<refund-1@holdfast.example>"
    message.set_content("We refunded €10.00.")
    with smtplib.SMTP("127.0.0.1", sandbox.smtp_port, timeout=10) as smtp:
        smtp.send_message(message)

    stats = sandbox.stats()["messages"]
    assert stats == {
        "total": 1,
        "by_recipient": {"ada@example.com": 1, "grace@example.com": 1},
    }
    [stored] = sandbox.get("/_sandbox/messages").json()["messages"]
    assert stored["mail_from"] == "support@holdfast.example"
    assert stored["rcpt_tos"] == ["ada@example.com", "grace@example.com"]
    assert stored["subject"] == "Your refund"
    assert stored["message_id"] == "<refund-1@holdfast.example>"
    assert stored["body"].strip() == "We refunded €10.00."


def test_it_stores_a_message_sent_with_djangos_smtp_backend(sandbox):
    connection = get_connection(
        "django.core.mail.backends.smtp.EmailBackend",
        host="127.0.0.1",
        port=sandbox.smtp_port,
        timeout=10,
    )
    sent = EmailMessage(
        "Order ord_1001",
        "Your order is on its way.",
        "support@holdfast.example",
        ["ada@example.com"],
        connection=connection,
    ).send()
    assert sent == 1
    assert sandbox.stats()["messages"]["by_recipient"] == {"ada@example.com": 1}
    [stored] = sandbox.get("/_sandbox/messages").json()["messages"]
    assert stored["subject"] == "Order ord_1001"
    assert stored["body"].strip() == "Your order is on its way."

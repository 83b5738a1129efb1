"""SMTP faults, armed through POST /_sandbox/faults, as a real SMTP client meets them and
as the sink's records (GET /_sandbox/messages) show them."""

from __future__ import annotations

import smtplib
import time
from email.message import EmailMessage as StdlibMessage

import pytest
from django.core.mail import EmailMessage, get_connection

SENDER = "support@holdfast.example"


def message(subject: str = "Your refund", to: str = "ada@example.com") -> StdlibMessage:
    mail = StdlibMessage()
    mail["From"] = SENDER
    mail["To"] = to
    mail["Subject"] = subject
    mail.set_content("We refunded €10.00.")
    return mail


def send(sandbox, mail: StdlibMessage, *, timeout: float = 10) -> None:
    with smtplib.SMTP("127.0.0.1", sandbox.smtp_port, timeout=timeout) as smtp:
        smtp.send_message(mail)


def stored(sandbox) -> list[str]:
    """Subjects of the messages the sink accepted, oldest first."""
    messages = sandbox.get("/_sandbox/messages").json()["messages"]
    return [entry["subject"] for entry in reversed(messages)]


def armed(sandbox) -> list[dict]:
    return sandbox.get("/_sandbox/faults").json()["faults"]


def arm(sandbox, kind: str, **extra) -> dict:
    answer = sandbox.post("/_sandbox/faults", json={"kind": kind, **extra})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_drop_after_accept_keeps_the_message_and_the_sender_hears_nothing(sandbox):
    arm(sandbox, "smtp_drop_after_accept")

    with pytest.raises(smtplib.SMTPServerDisconnected):
        send(sandbox, message("Dropped"))

    assert stored(sandbox) == ["Dropped"]
    assert sandbox.stats()["messages"]["by_recipient"] == {"ada@example.com": 1}
    send(sandbox, message("Next"))
    assert stored(sandbox) == ["Dropped", "Next"]


def test_a_refusal_refuses_every_recipient_with_550_and_stores_nothing(sandbox):
    arm(sandbox, "smtp_refuse")

    with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
        send(sandbox, message(to="ada@example.com, grace@example.com"))

    assert {address: code for address, (code, _) in refused.value.recipients.items()} == {
        "ada@example.com": 550,
        "grace@example.com": 550,
    }
    assert stored(sandbox) == []
    assert sandbox.stats()["messages"]["total"] == 0


def test_a_refusal_can_be_temporary(sandbox):
    arm(sandbox, "smtp_refuse", code=451)

    with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
        send(sandbox, message())

    [(code, reply)] = refused.value.recipients.values()
    assert code == 451
    assert reply.startswith(b"4.2.0")
    assert stored(sandbox) == []


def test_djangos_smtp_backend_raises_the_refusal_the_mail_tool_maps_to_refused(sandbox):
    # support.tools.send_customer_email turns SMTPRecipientsRefused into ToolRefused.
    arm(sandbox, "smtp_refuse")
    connection = get_connection(
        "django.core.mail.backends.smtp.EmailBackend",
        host="127.0.0.1",
        port=sandbox.smtp_port,
        timeout=10,
    )
    with pytest.raises(smtplib.SMTPRecipientsRefused):
        EmailMessage("Refused", "body", SENDER, ["ada@example.com"], connection=connection).send()
    assert stored(sandbox) == []


def test_a_sender_that_gives_up_on_a_delayed_reply_sent_the_message_anyway(sandbox):
    arm(sandbox, "smtp_delay", delay=2.0)

    with pytest.raises(smtplib.SMTPServerDisconnected, match="timed out"):
        send(sandbox, message("Gave up"), timeout=0.7)

    assert stored(sandbox) == ["Gave up"]


def test_a_delay_answers_250_late(sandbox):
    arm(sandbox, "smtp_delay", delay=0.5)

    started = time.monotonic()
    send(sandbox, message("Waited"))

    assert time.monotonic() - started >= 0.5
    assert stored(sandbox) == ["Waited"]


def test_smtp_faults_fire_for_their_count_then_stop(sandbox):
    arm(sandbox, "smtp_refuse", count=2)

    for _ in range(2):
        with pytest.raises(smtplib.SMTPRecipientsRefused):
            send(sandbox, message("Refused"))
    send(sandbox, message("Accepted"))

    assert stored(sandbox) == ["Accepted"]
    assert armed(sandbox) == []


def test_smtp_faults_are_listed_and_cleared(sandbox):
    fault = arm(sandbox, "smtp_refuse", count=3, code=554)

    assert fault["kind"] == "smtp_refuse"
    assert armed(sandbox) == [
        {
            "id": fault["id"],
            "kind": "smtp_refuse",
            "method": None,
            "path": None,
            "remaining": 3,
            "delay": 0.0,
            "retry_after": 1,
            "code": 554,
        }
    ]
    assert sandbox.delete("/_sandbox/faults").json() == {"cleared": 1}
    send(sandbox, message("After clearing"))
    assert stored(sandbox) == ["After clearing"]


def test_smtp_and_http_faults_do_not_take_each_others_turn(sandbox):
    arm(sandbox, "smtp_refuse")
    sandbox.arm("error_before", path="/", method="")

    assert sandbox.get("/shop/orders/ord_1001").status_code == 500
    assert sandbox.get("/shop/orders/ord_1001").status_code == 200
    with pytest.raises(smtplib.SMTPRecipientsRefused):
        send(sandbox, message())
    send(sandbox, message("Accepted"))

    assert stored(sandbox) == ["Accepted"]


@pytest.mark.parametrize("code", [250, 399, 600, "soon"])
def test_a_refusal_code_must_be_a_4xx_or_5xx(sandbox, code):
    answer = sandbox.post("/_sandbox/faults", json={"kind": "smtp_refuse", "code": code})
    assert answer.status_code == 400
    assert armed(sandbox) == []

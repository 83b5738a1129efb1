"""The SMTP sink: stores every message it accepts as the mail provider's record.

Armed SMTP faults (``sandbox.faults``) act on whole messages: each message takes at
most one, at its ``MAIL FROM``, and it decides how the recipients, the data and the
final reply are answered.
"""

from __future__ import annotations

import asyncio
import email
import logging
from email.message import EmailMessage
from email.policy import default as default_policy

from django.db import connections

from sandbox import clock, faults
from sandbox.models import DB, Fault, MailMessage

logger = logging.getLogger("sandbox.smtp")

# What an smtp_refuse answers each recipient, by the class of its code.
REFUSALS = {
    4: "4.2.0 Mailbox temporarily unavailable, try again later",
    5: "5.1.1 Mailbox unavailable",
}


def store_message(mail_from: str, rcpt_tos: list[str], content: bytes) -> MailMessage:
    parsed = email.message_from_bytes(content, policy=default_policy)
    body = ""
    if isinstance(parsed, EmailMessage):
        part = parsed.get_body(preferencelist=("plain", "html"))
        if part is not None:
            body = part.get_content()
    try:
        return MailMessage.objects.using(DB).create(
            mail_from=mail_from,
            rcpt_tos=list(rcpt_tos),
            subject=str(parsed.get("Subject", "")),
            message_id=str(parsed.get("Message-ID", "")),
            body=body,
            raw=content.decode("utf-8", errors="replace"),
            received_at=clock.now(),
        )
    finally:
        connections.close_all()


def take_fault() -> Fault | None:
    try:
        return faults.take_for_message()
    finally:
        connections.close_all()


class SinkHandler:
    """aiosmtpd handler; the ORM is synchronous, so reads and writes run in a worker thread.

    A message's fault rides on its envelope: aiosmtpd makes a new one per transaction.
    """

    async def handle_MAIL(self, server, session, envelope, address, mail_options) -> str:
        loop = asyncio.get_running_loop()
        try:
            envelope.fault = await loop.run_in_executor(None, take_fault)
        except Exception:
            logger.exception("could not read the armed faults")
            return "451 Requested action aborted: local error in processing"
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options) -> str:
        fault = getattr(envelope, "fault", None)
        if fault is not None and fault.kind == Fault.Kind.SMTP_REFUSE:
            logger.info("SMTP refused %s (fault smtp_refuse %s)", address, fault.smtp_code)
            return f"{fault.smtp_code} {REFUSALS[fault.smtp_code // 100]}"
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope) -> str:
        content = envelope.original_content or envelope.content
        if isinstance(content, str):
            content = content.encode("utf-8")
        loop = asyncio.get_running_loop()
        try:
            message = await loop.run_in_executor(
                None, store_message, envelope.mail_from, list(envelope.rcpt_tos), content
            )
        except Exception:
            logger.exception("could not store a message")
            return "451 Requested action aborted: local error in processing"
        logger.info(
            "SMTP accepted %s from %s to %s", message.pk, message.mail_from, message.rcpt_tos
        )
        fault = getattr(envelope, "fault", None)
        if fault is not None and fault.kind == Fault.Kind.SMTP_DROP_AFTER_ACCEPT:
            # The message is stored; the sender hears nothing (the reply written after
            # close() is discarded) and cannot know it was sent.
            logger.info("SMTP dropped the connection after accepting %s", message.pk)
            server.transport.close()
        elif fault is not None and fault.kind == Fault.Kind.SMTP_DELAY:
            await asyncio.sleep(fault.delay_seconds)
        return "250 Message accepted for delivery"

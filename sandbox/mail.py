"""The SMTP sink: accepts every message and stores it as the mail provider's record."""

from __future__ import annotations

import asyncio
import email
import logging
from email.message import EmailMessage
from email.policy import default as default_policy

from django.db import connections

from sandbox import clock
from sandbox.models import DB, MailMessage

logger = logging.getLogger("sandbox.smtp")


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


class SinkHandler:
    """aiosmtpd handler; the ORM is synchronous, so the write runs in a worker thread."""

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
        return "250 Message accepted for delivery"

"""The built-in agents that tell people a person is needed, as durable runs.

``notify`` tells the operators who may act on one approval or one case; it is
started once per event (request id ``notify:<kind>:<id>``; admission dedupes a
repeated start). ``notify_digest`` sends one operator the notices held for them
over one period (request id ``digest:<user id>:<period start>``). Every send is
an effect step with its own effect key: a crash replays the recorded steps and
never sends a finished one again.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from agentruns.runtime import Budget, ModelSpec, agent
from notifications.tools import (
    digest_facts,
    hold_for_digest,
    notice_facts,
    post_webhook,
    send_email,
)

NOTIFY = "notify"
NOTIFY_DIGEST = "notify_digest"
# The runs that notify: a case about one of their own sends is not notified again
# (it shows in the queue), or a mail server that fails mid-send could chain them.
NOTIFY_AGENTS = (NOTIFY, NOTIFY_DIGEST)

# No model is called: these agents only run tools.
NO_MODEL = ModelSpec(provider="scripted", model="scripted-1", prompt_version="notify-1")


class NotifyInput(BaseModel):
    kind: Literal["approval", "case"]
    object_id: int = Field(gt=0)


@agent(
    name=NOTIFY,
    version=1,
    tools=[notice_facts, send_email, hold_for_digest, post_webhook],
    input_model=NotifyInput,
    model=NO_MODEL,
    budget=Budget(max_steps=500, max_model_calls=0),
)
def notify(ctx, input):
    facts = ctx.tool("notice_facts", {"kind": input["kind"], "object_id": input["object_id"]})
    if not facts.ok:
        ctx.outcome("not_notified", facts.error or "")
        return {"notified": 0}
    notice = facts.value
    if not notice["waiting"]:
        ctx.outcome("nothing_waits", f"the {input['kind']} no longer waits for anyone")
        return {"notified": 0}
    emailed, held = 0, 0
    for recipient in notice["recipients"]:
        if recipient["delivery"] == "digest":
            ctx.tool(
                "hold_for_digest",
                {
                    "user_id": recipient["user_id"],
                    "subject": notice["subject"],
                    "summary": notice["text"],
                    "link": notice["link"],
                },
            )
            held += 1
        else:
            ctx.tool(
                "send_email",
                {"to": recipient["to"], "subject": notice["subject"], "body": notice["text"]},
            )
            emailed += 1
    posted = False
    if notice["webhook"]:
        posted = ctx.tool(
            "post_webhook",
            {"title": notice["subject"], "text": notice["text"], "link": notice["link"]},
        ).ok
    ctx.outcome("notified", f"{emailed} emailed, {held} held for a digest, webhook: {posted}")
    return {"emailed": emailed, "held": held, "webhook": posted}


class DigestInput(BaseModel):
    user_id: int = Field(gt=0)
    digest_request: str = Field(min_length=1, max_length=200)


@agent(
    name=NOTIFY_DIGEST,
    version=1,
    tools=[digest_facts, send_email],
    input_model=DigestInput,
    model=NO_MODEL,
    budget=Budget(max_steps=10, max_model_calls=0),
)
def notify_digest(ctx, input):
    digest = ctx.tool("digest_facts", dict(input)).value or {}
    if not digest.get("count") or not digest.get("to"):
        ctx.outcome("nothing_to_send", "no notice waits, or the operator has no address")
        return {"sent": False}
    ctx.tool(
        "send_email", {"to": digest["to"], "subject": digest["subject"], "body": digest["body"]}
    )
    ctx.outcome("digest_sent", f"{digest['count']} notice(s)")
    return {"sent": True, "count": digest["count"]}


AGENTS = [notify, notify_digest]

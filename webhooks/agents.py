"""The built-in agent that delivers one webhook event to one endpoint, as a durable run.

``webhook_deliver`` is started once per delivery (request id ``webhook:<delivery id>``;
admission dedupes a repeated start). Its one effect step posts the event; the
engine records every attempt, waits between them and resends after a crash under
the same ``webhook-id``, which the receiver deduplicates.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from agentruns.runtime import Budget, ModelSpec, agent
from webhooks.tools import deliver_webhook

WEBHOOK_DELIVER = "webhook_deliver"
# Runs of these agents raise no "run ended" event of their own.
WEBHOOK_AGENTS = (WEBHOOK_DELIVER,)

NO_MODEL = ModelSpec(provider="scripted", model="scripted-1", prompt_version="webhook-1")


class DeliverInput(BaseModel):
    delivery_id: int = Field(gt=0)


@agent(
    name=WEBHOOK_DELIVER,
    version=1,
    tools=[deliver_webhook],
    input_model=DeliverInput,
    model=NO_MODEL,
    budget=Budget(max_steps=5, max_model_calls=0),
)
def webhook_deliver(ctx, input):
    sent = ctx.tool("deliver_webhook", {"delivery_id": input["delivery_id"]})
    if sent.ok:
        ctx.outcome("delivered", f"answered {sent.value.get('status_code') or 'earlier'}")
        return {"delivered": True}
    ctx.outcome(sent.error_class or "not_delivered", sent.error or "")
    return {"delivered": False}


AGENTS = [webhook_deliver]

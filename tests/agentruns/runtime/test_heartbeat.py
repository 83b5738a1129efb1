"""The lease while a call is out: renewed within the call's timeout, never past it, never
after the call returned."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from pydantic import BaseModel

from agentruns.models import Run
from agentruns.runtime import READ_ONLY, Registry, agent, tool
from agentruns.runtime.heartbeat import Heartbeat
from agentruns.runtime.writes import Fence
from tests.harness import Harness

pytestmark = pytest.mark.django_db(transaction=True)

# A short lease: renewed every 0.2 s, lapsed 0.6 s after the last renewal.
LEASE = 0.6


class SlowArgs(BaseModel):
    seconds: float


def _slow(request, call):
    time.sleep(request["seconds"])
    return {"slept": request["seconds"]}


slow = tool(name="slow", args=SlowArgs, description="Take a while.", recovery=READ_ONLY)(_slow)
# The same call, but the tool says it gives up after 0.3 s (and then does not).
overrunning = tool(
    name="overrunning",
    args=SlowArgs,
    description="Outlive its timeout.",
    recovery=READ_ONLY,
    timeout=0.3,
)(_slow)


@agent(name="patient", version=1, tools=[slow, overrunning])
def patient(ctx, input):
    result = ctx.tool(input["tool"], {"seconds": input["seconds"]})
    return {"ok": result.ok}


@pytest.fixture
def short_lease(tenant) -> Harness:
    harness = Harness(tenant, lease_seconds=LEASE)
    harness.registry = Registry([patient])
    harness.engine = harness.build()
    return harness


def test_a_call_longer_than_the_lease_keeps_it_while_within_its_timeout(short_lease):
    run = short_lease.start("patient", {"tool": "slow", "seconds": 1.5})
    # Without renewals the lease lapses 0.6 s into the 1.5 s call and the answer's
    # commit is refused.
    assert short_lease.advance(run) == "finished:completed"
    assert Run.objects.get(pk=run.id).output == {"ok": True}


def test_a_call_that_outlives_its_timeout_lets_the_lease_lapse(short_lease):
    run = short_lease.start("patient", {"tool": "overrunning", "seconds": 1.5})
    assert short_lease.advance(run) == "lease_lost"
    run.refresh_from_db()
    assert run.status == "running"  # for the sweeper and another worker to take over
    assert run.lease_expires_at is not None


class RecordingStore:
    """A store whose renewals take a while, and say when they ran."""

    alias = "default"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.renewals: list[tuple[float, float]] = []
        self.started = threading.Event()

    def renew_lease(self, fence, lease) -> bool:
        began = time.monotonic()
        self.started.set()
        time.sleep(self.seconds)
        self.renewals.append((began, time.monotonic()))
        return True


def test_leaving_the_cover_waits_for_a_renewal_in_flight_and_none_follows():
    heartbeat = Heartbeat()
    store = RecordingStore(seconds=0.3)
    fence = Fence(uuid.uuid4(), 1, "worker-a")
    with heartbeat.covering(
        store,
        fence,
        lease=3.0,
        interval=0.05,
        deadline=time.monotonic() + 60,
        monotonic=time.monotonic,
    ):
        assert store.started.wait(5)
    left = time.monotonic()
    # The renewal that was in flight ended before the block was left...
    assert store.renewals and store.renewals[-1][1] <= left
    count = len(store.renewals)
    time.sleep(0.3)
    # ...and no renewal began after it.
    assert len(store.renewals) == count


def test_one_thread_renews_for_every_call_out_in_the_process():
    heartbeat = Heartbeat()
    stores = [RecordingStore(seconds=0) for _ in range(3)]
    before = threading.active_count()

    def call(store):
        with heartbeat.covering(
            store,
            Fence(uuid.uuid4(), 1, "w"),
            lease=3.0,
            interval=0.05,
            deadline=time.monotonic() + 60,
            monotonic=time.monotonic,
        ):
            time.sleep(0.4)

    callers = [threading.Thread(target=call, args=(store,)) for store in stores]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert all(len(store.renewals) >= 3 for store in stores)
    # The three callers are gone; the heartbeat's own thread stays, alone.
    assert threading.active_count() == before + 1

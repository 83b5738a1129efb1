"""The live pages' follower: one read of a tenant's logs serves every socket of it;
on PostgreSQL a commit wakes it (LISTEN/NOTIFY), a rollback does not, and a missed
notification is repaired by the safety re-read."""

from __future__ import annotations

import asyncio
import os
import time

import psycopg
import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection, transaction

from accounts.services import audit_record
from agentruns import follower as follower_module
from agentruns.doorbell import Doorbell
from agentruns.follower import LIVE_CHANNEL, Follower, Moved, live_sync_to_async
from agentruns.runtime.outages import Outage
from agentruns.side_connections import side_connection_params
from config.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)

on_postgresql = pytest.mark.skipif(
    not os.environ.get("DATABASE_URL", "").startswith("postgres"),
    reason="LISTEN/NOTIFY is PostgreSQL's; SQLite's follower polls (tested above)",
)


class Page:
    """A socket as the follower sees it: it takes batches."""

    def __init__(self, tenant_id: int):
        self.tenant_id = tenant_id
        self.batches: list[Moved] = []
        self.arrived = asyncio.Event()

    def deliver(self, moved: Moved) -> None:
        self.batches.append(moved)
        self.arrived.set()


async def _arrived(page: Page, timeout: float = 5.0) -> Moved:
    await asyncio.wait_for(page.arrived.wait(), timeout=timeout)
    return page.batches[-1]


def test_the_pages_thread_keeps_its_connection_while_pages_are_open(tenant, monkeypatch):
    # As in the web process (config/asgi.py): a request's connection is closed after it.
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)
    connection.close()

    def connection_used():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return connection.connection

    async def scenario():
        follower = Follower()
        page = Page(tenant.id)
        await follower.subscribe(page)
        kept = [await live_sync_to_async(connection_used)() for _ in range(3)]
        await follower.unsubscribe(page)  # the last page of the process closes
        after = await live_sync_to_async(lambda: connection.connection)()
        plain = [await database_sync_to_async(connection_used)() for _ in range(2)]
        return kept, after, plain

    kept, after, plain = async_to_sync(scenario)()
    assert kept[0] is kept[1] is kept[2]  # one connection for the pages' calls
    assert after is None  # given back once no page is open
    assert plain[0] is not plain[1]  # a request's calls connect each time


def test_one_read_serves_every_socket_of_the_tenant(tenant, harness, settings):
    settings.HOLDFAST_LIVE_POLL_SECONDS = 0.2
    settings.HOLDFAST_LIVE_REREAD_SECONDS = 0.2

    async def scenario():
        follower = Follower()
        pages = [Page(tenant.id) for _ in range(50)]
        for page in pages:
            await follower.subscribe(page)
        reads_before = follower.reads
        run = await database_sync_to_async(harness.start)("flow", {"sleep": 600})
        batches = [await _arrived(page) for page in pages]
        reads = follower.reads - reads_before
        for page in pages:
            await follower.unsubscribe(page)
        return run, batches, reads

    run, batches, reads = async_to_sync(scenario)()
    # Every socket got the very same batch, from one read of the tenant's logs.
    assert all(batch is batches[0] for batch in batches)
    assert [event[1:] for event in batches[0].events] == [(run.id, "created")]
    # The reads are the follower's, a few at most while the run was started, never
    # one per socket.
    assert 1 <= reads < 10


def test_another_tenants_commit_reaches_none_of_these_sockets(
    tenant, other_tenant, harness, settings
):
    settings.HOLDFAST_LIVE_POLL_SECONDS = 0.05
    settings.HOLDFAST_LIVE_REREAD_SECONDS = 0.05

    async def scenario():
        follower = Follower()
        ours = Page(tenant.id)
        await follower.subscribe(ours)
        await database_sync_to_async(audit_record)(
            tenant=other_tenant,
            actor="user:x",
            action="run.retry",
            object_type="run",
            object_id="1",
        )
        await asyncio.sleep(0.5)
        await follower.unsubscribe(ours)
        return ours.batches

    assert async_to_sync(scenario)() == []


def test_a_missed_notification_is_repaired_by_the_safety_reread(tenant, settings, monkeypatch):
    """A listener that heard nothing (here: one that never listens; in life, one that
    was reconnecting): the page still gets the change at the next re-read. On SQLite
    this is the follower's poll."""
    settings.HOLDFAST_LIVE_POLL_SECONDS = 0.3
    settings.HOLDFAST_LIVE_REREAD_SECONDS = 0.3

    async def deaf(self):
        await asyncio.Event().wait()

    monkeypatch.setattr(Follower, "_listen_loop", deaf)

    async def scenario():
        follower = Follower()
        page = Page(tenant.id)
        await follower.subscribe(page)
        await database_sync_to_async(audit_record)(
            tenant=tenant,
            actor="user:ann",
            action="case.resolve",
            object_type="case",
            object_id="7",
        )
        moved = await _arrived(page)
        await follower.unsubscribe(page)
        return moved

    moved = async_to_sync(scenario)()
    assert [entry[1:] for entry in moved.audit] == [("case", "7", "case.resolve")]


@on_postgresql
def test_a_commit_reaches_a_connected_socket_through_notify(
    client, tenant, make_operator, harness, settings
):
    # No re-read within the test: only the notification can bring the change.
    settings.HOLDFAST_LIVE_REREAD_SECONDS = 60
    client.force_login(make_operator(tenant, "viewer"))
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    headers = [(b"origin", b"http://127.0.0.1"), (b"cookie", cookie.encode())]
    run = harness.start("flow", {"sleep": 600})

    async def scenario():
        socket = WebsocketCommunicator(application, "/ws/runs/", headers=headers)
        assert (await socket.connect(timeout=20))[0]
        await socket.receive_from(timeout=10)  # the snapshot
        await asyncio.sleep(0.3)  # the listener's first read is behind us
        await database_sync_to_async(harness.advance)(run)
        # Generous: on a busy machine the first render of a process is slow.
        update = await socket.receive_from(timeout=10)
        await socket.disconnect()
        return update

    update = async_to_sync(scenario)()
    assert f'<tr id="run-{run.id}" hx-swap-oob="true"' in update and "sleeping" in update


@on_postgresql
def test_a_commit_notifies_its_tenant_and_a_rollback_notifies_nothing(tenant):
    with psycopg.connect(**side_connection_params(), autocommit=True) as listener:
        listener.execute(f"LISTEN {LIVE_CHANNEL}")
        with pytest.raises(RuntimeError), transaction.atomic():
            audit_record(
                tenant=tenant,
                actor="user:ann",
                action="run.cancel",
                object_type="run",
                object_id="1",
            )
            raise RuntimeError("rolled back")
        assert list(listener.notifies(timeout=0.5)) == []
        audit_record(
            tenant=tenant, actor="user:ann", action="run.cancel", object_type="run", object_id="1"
        )
        heard = list(listener.notifies(timeout=2, stop_after=1))
    assert [(notice.channel, notice.payload) for notice in heard] == [
        (LIVE_CHANNEL, str(tenant.id))
    ]


def test_a_transition_that_wrote_an_event_rings_with_its_run_and_one_that_wrote_nothing_does_not(
    harness,
):
    rung = []
    engine = harness.build(committed=rung.append)
    run = harness.start("flow", {"sleep": 600})
    harness.advance(run, engine)  # claimed, a step, asleep: each commit wrote an event
    assert rung and set(rung) == {run.id}
    rung.clear()
    # A compare-and-set that matches nothing commits nothing and rings nothing.
    assert not engine.store.mark_due(run.id, statuses=["waiting_for_approval"], by="user:ann")
    assert rung == []
    assert engine.store.mark_due(run.id, statuses=["sleeping"], by="user:ann")
    assert rung == [run.id]


@on_postgresql
def test_the_doorbell_sends_one_notification_per_tenant_for_many_rings(
    tenant, other_tenant, harness, settings
):
    from tests.harness import Harness

    settings.HOLDFAST_LIVE_NOTIFY_SECONDS = 0.2  # every ring below lands in one gathering
    ours = [harness.start("flow", {"sleep": 600}) for _ in range(3)]
    theirs = Harness(other_tenant).start("flow", {"sleep": 600})
    time.sleep(0.5)  # the process's own doorbell has announced those starts before we listen
    doorbell = Doorbell()
    with psycopg.connect(**side_connection_params(), autocommit=True) as listener:
        listener.execute(f"LISTEN {LIVE_CHANNEL}")
        for _ in range(20):
            for run in [*ours, theirs]:
                doorbell.ring(run.id)
        heard = sorted(notice.payload for notice in listener.notifies(timeout=2))
    assert heard == sorted([str(tenant.id), str(other_tenant.id)])


@on_postgresql
def test_the_engines_commit_notifies_the_runs_tenant_after_it(tenant, harness):
    run = harness.start("flow", {"sleep": 600})
    with psycopg.connect(**side_connection_params(), autocommit=True) as listener:
        listener.execute(f"LISTEN {LIVE_CHANNEL}")
        harness.advance(run)  # the harness's engine rings the process's doorbell
        heard = {notice.payload for notice in listener.notifies(timeout=1)}
    assert heard == {str(tenant.id)}


@on_postgresql
def test_no_event_statement_notifies_inside_its_transaction(tenant, harness):
    """The engine's hot path takes no notification lock: its events carry no trigger."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'agentruns_runevent'::regclass "
            "AND NOT tgisinternal"
        )
        assert cursor.fetchall() == []
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'accounts_auditentry'::regclass "
            "AND NOT tgisinternal"
        )
        assert cursor.fetchall() == [("auditentry_notify_live",)]


@on_postgresql
def test_after_the_listener_reconnects_every_tenant_is_read_again(tenant, settings, monkeypatch):
    settings.HOLDFAST_LIVE_REREAD_SECONDS = 60

    class SlowReturn(Outage):
        def failed(self, exc):
            super().failed(exc)
            return 1.0  # the commit below lands while no one listens

    monkeypatch.setattr(
        follower_module, "LISTEN_OUTAGE", SlowReturn("test listener", follower_module.log)
    )

    def listeners() -> list[int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND query = %s",
                [f"LISTEN {LIVE_CHANNEL}"],
            )
            return [row[0] for row in cursor.fetchall()]

    def cut_and_commit() -> None:
        with connection.cursor() as cursor:
            for pid in listeners():
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        # Committed while no one listens: its notification is lost.
        audit_record(
            tenant=tenant,
            actor="user:ann",
            action="approval.approve",
            object_type="approval",
            object_id="3",
        )

    async def scenario():
        follower = Follower()
        page = Page(tenant.id)
        await follower.subscribe(page)
        deadline = time.monotonic() + 5
        while not await database_sync_to_async(listeners)():
            assert time.monotonic() < deadline, "the follower never listened"
            await asyncio.sleep(0.05)
        await database_sync_to_async(cut_and_commit)()
        moved = await _arrived(page, timeout=10)
        await follower.unsubscribe(page)
        return moved

    moved = async_to_sync(scenario)()
    assert [entry[1:] for entry in moved.audit] == [("approval", "3", "approval.approve")]


def test_callers_of_one_key_share_one_call_and_a_closed_one_cancels_only_its_own_wait():
    async def scenario():
        shared = follower_module.Shared()
        started = []
        release = asyncio.Event()

        async def render():
            started.append(time.monotonic())
            await release.wait()
            return "fragments"

        callers = [asyncio.create_task(shared.call("key", 0.0, render)) for _ in range(3)]
        await asyncio.sleep(0)
        callers[0].cancel()  # its socket closed while it waited
        release.set()
        results = await asyncio.gather(*callers, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        assert results[1:] == ["fragments", "fragments"]
        # Answered: a later caller of the same key takes the answer, nothing runs again.
        assert await shared.call("key", 0.0, render) == "fragments"
        assert len(started) == 1
        # Asking for one started no earlier than now: a fresh call.
        assert await shared.call("key", time.monotonic(), render) == "fragments"
        assert len(started) == 2

    async_to_sync(scenario)()


def test_a_failed_shared_call_fails_every_waiter_and_the_next_caller_asks_again():
    async def scenario():
        shared = follower_module.Shared()
        calls = []

        async def check():
            calls.append(1)
            await asyncio.sleep(0)
            if len(calls) == 1:
                raise OSError("the database is away")
            return ""

        waiting = [asyncio.create_task(shared.call("session", 0.0, check)) for _ in range(2)]
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert [type(result) for result in results] == [OSError, OSError]
        # A failure is nobody's answer: the next caller's call runs again.
        assert await shared.call("session", 0.0, check) == ""
        assert len(calls) == 2

    async_to_sync(scenario)()

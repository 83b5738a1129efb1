"""The queue's broker: on PostgreSQL an enqueue wakes a waiting pusher through NOTIFY
once it commits (a rollback wakes nobody), no knock is lost between a pusher's look
and its wait, and a pusher whose listener cannot connect polls as django-q2's ORM
broker does; on SQLite it is that broker, polling."""

from __future__ import annotations

import os
import pickle
import threading
import time

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.conf import Conf
from django_q.models import OrmQ

from agentruns import broker as broker_module
from agentruns.broker import QUEUE_CHANNEL, ListeningORM
from agentruns.side_connections import side_connection_params

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

on_postgresql = pytest.mark.skipif(
    not os.environ.get("DATABASE_URL", "").startswith("postgres"),
    reason="LISTEN/NOTIFY is PostgreSQL's; SQLite's broker polls (tested below)",
)

LIST_KEY = "holdfast-broker-test"


@pytest.fixture
def broker():
    queue = ListeningORM(list_key=LIST_KEY)
    yield queue
    queue._close_listener()
    OrmQ.objects.using(Conf.ORM).filter(key=LIST_KEY).delete()


@pytest.fixture
def slow_reread(settings):
    # Far longer than any wake-up below: a pusher that returns in time was woken.
    settings.HOLDFAST_QUEUE_REREAD_SECONDS = 60.0


def _until_listening(*queues: ListeningORM) -> None:
    deadline = time.monotonic() + 10
    while any(queue._listener is None for queue in queues):
        assert time.monotonic() < deadline, "a pusher never listened"
        time.sleep(0.02)
    time.sleep(0.3)  # past its look, into its wait


def _dequeue_in_thread(queue: ListeningORM) -> tuple[threading.Thread, list]:
    taken: list = []

    def pusher() -> None:
        try:
            taken.append(queue.dequeue())
        finally:
            connection.close()

    thread = threading.Thread(target=pusher, daemon=True)
    thread.start()
    return thread, taken


def test_the_configured_broker_is_the_listening_one():
    assert isinstance(get_broker(), ListeningORM)


@on_postgresql
def test_a_waiting_pusher_is_woken_by_an_enqueue_and_takes_it(broker, slow_reread):
    thread, taken = _dequeue_in_thread(broker)
    # The pusher has looked, found nothing and waits on its listener.
    _until_listening(broker)
    assert thread.is_alive(), "the pusher should be waiting for a knock"
    task_id = ListeningORM(list_key=LIST_KEY).enqueue("the payload")
    thread.join(timeout=10)
    assert not thread.is_alive(), "the enqueue's NOTIFY did not wake the pusher"
    assert taken == [[(task_id, "the payload")]]


@on_postgresql
def test_an_enqueue_announces_itself_after_its_commit_and_a_rollback_announces_nothing(broker):
    with psycopg.connect(**side_connection_params(), autocommit=True) as listener:
        listener.execute(f"LISTEN {QUEUE_CHANNEL}")
        with pytest.raises(RuntimeError), transaction.atomic(using=Conf.ORM):
            broker.enqueue("rolled back")
            raise RuntimeError("rolled back")
        assert list(listener.notifies(timeout=0.5)) == []
        assert not OrmQ.objects.using(Conf.ORM).filter(key=LIST_KEY).exists()
        with transaction.atomic(using=Conf.ORM):
            broker.enqueue("committed")
            # Nothing is said before the task can be read.
            assert list(listener.notifies(timeout=0.3)) == []
        heard = list(listener.notifies(timeout=5, stop_after=1))
    assert [(notice.channel, notice.payload) for notice in heard] == [(QUEUE_CHANNEL, LIST_KEY)]


@on_postgresql
def test_a_task_committed_between_the_look_and_the_wait_is_not_missed(broker, slow_reread):
    assert broker._listen()
    assert broker._take() == []
    task_id = ListeningORM(list_key=LIST_KEY).enqueue("in between")
    # The knock came while nobody waited: it waits in the listener's connection.
    thread = threading.Thread(
        target=broker._wait, args=(broker_module.settings.HOLDFAST_QUEUE_REREAD_SECONDS,)
    )
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "the knock sent before the wait was lost"
    assert broker._take() == [(task_id, "in between")]


@on_postgresql
def test_two_pushers_woken_by_one_task_take_it_once(slow_reread):
    first, second = ListeningORM(list_key=LIST_KEY), ListeningORM(list_key=LIST_KEY)
    try:
        threads = [_dequeue_in_thread(first), _dequeue_in_thread(second)]
        _until_listening(first, second)
        task_id = ListeningORM(list_key=LIST_KEY).enqueue("once")
        for thread, _ in threads:
            thread.join(timeout=70)
        results = [taken[0] for _, taken in threads]
        # One of them took it; the other lost the compare-and-set and found nothing.
        assert sorted(results, key=lambda found: found is None) == [[(task_id, "once")], None]
    finally:
        first._close_listener()
        second._close_listener()
        OrmQ.objects.using(Conf.ORM).filter(key=LIST_KEY).delete()


@on_postgresql
def test_a_pusher_whose_listener_cannot_connect_polls_and_still_takes_tasks(
    broker, monkeypatch, slow_reread
):
    attempts = []

    def refused(*args, **kwargs):
        attempts.append(kwargs)
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(psycopg, "connect", refused)
    monkeypatch.setattr("django_q.brokers.orm.sleep", lambda seconds: None)
    task_id = broker.enqueue("polled")
    assert broker.dequeue() == [(task_id, "polled")]
    assert broker.dequeue() is None
    # One attempt per re-read interval, not one per look; with a timeout of its own.
    assert len(attempts) == 1
    assert attempts[0]["connect_timeout"] == 5
    assert broker._listener is None
    assert broker_module.QUEUE_LISTEN_OUTAGE.down
    monkeypatch.undo()
    # The database answers again and the interval has passed: the next look listens.
    broker._retry_listening_at = 0.0
    task_id = broker.enqueue("listened")
    assert broker.dequeue() == [(task_id, "listened")]
    assert broker._listener is not None
    assert not broker_module.QUEUE_LISTEN_OUTAGE.down


@on_postgresql
def test_a_lost_queue_connection_is_waited_out_not_raised(broker, slow_reread):
    task_id = broker.enqueue("after a restart")
    assert broker._listen()
    # The server ends this process's queue connection (a restart, a failover).
    with psycopg.connect(**side_connection_params(), autocommit=True) as admin:
        connection.ensure_connection()
        backend = connection.connection.info.backend_pid
        admin.execute("SELECT pg_terminate_backend(%s)", [backend])
    assert broker.dequeue() == [(task_id, "after a restart")]
    broker.acknowledge(task_id)
    assert not OrmQ.objects.using(Conf.ORM).filter(pk=task_id).exists()


@on_postgresql
def test_a_broken_listener_is_replaced_at_the_next_look(broker, slow_reread):
    assert broker._listen()
    with psycopg.connect(**side_connection_params(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [broker._listener.info.backend_pid])
    broker._wait(1.0)  # the wait finds the connection gone and closes it
    assert broker._listener is None
    task_id = ListeningORM(list_key=LIST_KEY).enqueue("after the loss")
    assert broker.dequeue() == [(task_id, "after the loss")]
    assert broker._listener is not None and not broker._listener.closed


def test_a_broker_handed_to_another_process_starts_without_a_listener(broker):
    if connection.vendor == "postgresql":
        assert broker._listen()
    copy = pickle.loads(pickle.dumps(broker))
    assert copy.list_key == LIST_KEY
    assert copy._listener is None and copy._listener_pid is None


@pytest.mark.skipif(
    os.environ.get("DATABASE_URL", "").startswith("postgres"),
    reason="on PostgreSQL the broker listens (tested above)",
)
def test_on_sqlite_it_polls_as_the_orm_broker_does(broker, monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr("django_q.brokers.orm.sleep", slept.append)
    assert broker.dequeue() is None
    assert slept == [Conf.POLL]
    task_id = broker.enqueue("polled")
    assert broker.dequeue() == [(task_id, "polled")]
    assert broker._listener is None


@on_postgresql
def test_a_taken_task_waits_out_its_lock_and_is_taken_again_if_never_acknowledged(broker):
    task_id = broker.enqueue("held by a cluster that died")
    assert broker._take() == [(task_id, "held by a cluster that died")]
    assert broker._take() == []  # locked for the cluster that took it
    # Its lock lapses (django-q2's retry): another cluster takes it again.
    OrmQ.objects.using(Conf.ORM).filter(pk=task_id).update(lock=timezone.now())
    assert broker._take() == [(task_id, "held by a cluster that died")]
    broker.acknowledge(task_id)
    assert not OrmQ.objects.using(Conf.ORM).filter(pk=task_id).exists()


@on_postgresql
def test_tasks_are_taken_oldest_first(broker):
    first = broker.enqueue("first")
    second = broker.enqueue("second")
    assert broker._take() == [(first, "first")]
    assert broker._take() == [(second, "second")]


class _KeepingBroker:
    """What django-q2's ``async_task`` hands its broker, kept instead of sent."""

    list_key = Conf.CLUSTER_NAME

    def __init__(self) -> None:
        self.packages: list[str] = []

    def enqueue(self, package: str) -> int:
        self.packages.append(package)
        return len(self.packages)


@on_postgresql
def test_an_admissions_queue_row_carries_the_package_async_task_would_have_sent():
    from django_q.signing import SignedPackage
    from django_q.tasks import async_task

    keeper = _KeepingBroker()
    async_task("agentruns.tasks.advance_run", "run-1", group="advance_run", broker=keeper)
    sent = SignedPackage.loads(keeper.packages[0])
    row = broker_module.queue_row("agentruns.tasks.advance_run", "run-1", group="advance_run")
    built = SignedPackage.loads(row.payload)
    assert row.key == Conf.CLUSTER_NAME and row.pk is None  # unsaved, for the caller's INSERT
    # Only what is new for every task differs: its id, its name and when it started.
    for own in ("id", "name", "started"):
        assert built.pop(own) and sent.pop(own)
    assert built == sent
    assert list(built) == list(sent)  # the same keys in the same order

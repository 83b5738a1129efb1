"""How long a knock waits in django-q2's broker before a cluster's pusher takes it.

Holdfast's broker is django-q2's ORM broker on the engine's database, woken by
``NOTIFY`` on PostgreSQL (``agentruns.broker.ListeningORM``); the baseline is the ORM
broker as django-q2 ships it, polling, and the other candidate for several hosts is
Redis. For each, a separate process runs the loop a cluster's pusher runs
(``broker.dequeue()``, acknowledging what it took), while this process enqueues N
timestamped packages at random moments (uniform over two poll intervals, so they do
not line up with the pusher's polls). Prints the pickup latency (enqueue to dequeue
returning it) of each broker, median, p95 and max, as a ratio of the polling ORM
broker's median measured in the same run, and the queue reads each pusher made a
second while it waited (SQLite has no NOTIFY: Holdfast's broker polls there, the
same as the baseline).

    .venv/bin/python benchmarks/broker_pickup.py [--tasks N] [--redis URL]

SQLite by default (the queue's own temporary file, as in the embedded default);
PostgreSQL when DATABASE_URL is set, to a dedicated database whose name contains
"bench" (created if missing, migrated). Redis at ``--redis`` (default
redis://127.0.0.1:6379/15); skipped when it does not answer. This measures the
brokers alone, not a task's run: both use the same ``poll`` (``Q_CLUSTER["poll"]``,
0.1 s) and ``bulk`` (1). A measurement, not a test: exit status 0 whatever the
figures.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.step_overhead import configure_environment  # noqa: E402

LIST_KEY = "holdfast-broker-bench"


def prepare_database() -> str:
    """Create (PostgreSQL, if missing) and migrate the queue's database; returns a label."""
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    alias = settings.Q_CLUSTER["orm"]
    connection = connections[alias]
    if connection.vendor == "postgresql":
        from benchmarks.step_overhead import ensure_postgres_database

        ensure_postgres_database(connection.settings_dict)
    call_command("migrate", "django_q", verbosity=0, interactive=False, database=alias)
    from django_q.models import OrmQ

    OrmQ.objects.using(alias).filter(key=LIST_KEY).delete()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT current_setting('server_version')")
            return f"ORM broker on PostgreSQL {cursor.fetchone()[0]}"
        cursor.execute("SELECT sqlite_version()")
        return f"ORM broker on SQLite {cursor.fetchone()[0]} (the queue's own file)"


def make_broker(kind: str, redis_url: str):
    from django_q.conf import Conf

    if kind == "redis":
        Conf.REDIS = redis_url
        from django_q.brokers.redis_broker import Redis

        return Redis(list_key=LIST_KEY)
    if kind == "listening":
        from agentruns.broker import ListeningORM

        return ListeningORM(list_key=LIST_KEY)
    from django_q.brokers.orm import ORM

    return ORM(list_key=LIST_KEY)


def pusher(kind: str, redis_url: str, count: int, results: Any) -> None:
    """What a cluster's pusher does: dequeue, and acknowledge what it took."""
    broker = make_broker(kind, redis_url)
    taken = 0
    calls = 0
    started = time.monotonic()
    while taken < count:
        calls += 1
        for task_id, payload in broker.dequeue() or []:
            results.put(time.time() - float(payload))
            if task_id is not None:
                broker.acknowledge(task_id)
            taken += 1
    # Each dequeue is one read of the queue (and a compare-and-set per task taken).
    results.put(("reads per second", (calls - count) / (time.monotonic() - started)))


def measure(kind: str, redis_url: str, count: int, poll: float) -> tuple[list[float], float]:
    from django.db import connections

    # The pusher opens its own connection: a forked one would share this one's socket.
    connections.close_all()
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    process = context.Process(target=pusher, args=(kind, redis_url, count, results))
    process.start()
    broker = make_broker(kind, redis_url)
    rng = random.Random(7)
    time.sleep(1.0)  # the pusher polling already
    for _ in range(count):
        time.sleep(rng.uniform(0, 2 * poll))
        broker.enqueue(repr(time.time()))
    latencies = [results.get(timeout=60) for _ in range(count)]
    _, idle_reads = results.get(timeout=60)
    process.join(timeout=10)
    return latencies, idle_reads


def describe(measured: tuple[list[float], float], baseline: list[float] | None = None) -> str:
    latencies, idle_reads = measured
    ordered = sorted(latencies)
    p95 = ordered[max(0, int(len(ordered) * 0.95) - 1)]
    ratio = (
        f"   {statistics.median(ordered) / statistics.median(baseline):.3f}x the baseline's median"
        if baseline
        else ""
    )
    return (
        f"median {statistics.median(ordered) * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms   "
        f"max {ordered[-1] * 1000:7.1f} ms   empty reads {idle_reads:5.1f}/s{ratio}"
    )


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.from_url(url, socket_connect_timeout=1).ping())
    except Exception:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200, help="packages per broker")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15", help="Redis to compare")
    args = parser.parse_args()
    configure_environment()
    from django.conf import settings

    label = prepare_database()
    poll = float(settings.Q_CLUSTER["poll"])
    print(f"{label}; poll {poll} s, {args.tasks} packages per broker")
    print("(a shared, busy 2-core machine: compare the ratio, not the absolute figures)")
    orm = measure("orm", args.redis, args.tasks, poll)
    print(f"ORM broker, polling (baseline)  {describe(orm)}")
    listening = measure("listening", args.redis, args.tasks, poll)
    print(f"Holdfast's ListeningORM         {describe(listening, orm[0])}")
    if not redis_answers(args.redis):
        print(f"Redis at {args.redis} does not answer: not measured")
        return
    redis_latencies = measure("redis", args.redis, args.tasks, poll)
    print(f"Redis broker                    {describe(redis_latencies, orm[0])}")


if __name__ == "__main__":
    main()

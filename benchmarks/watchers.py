"""What open live pages cost the database, and how soon a commit reaches them.

Starts a real web process (daphne, as ``make run``'s Procfile does) on 127.0.0.1
against a dedicated PostgreSQL database, logs one operator in, and opens N live run
lists (``/ws/runs/``, websocket clients carrying the session cookie) for N in
``--pages`` (1, 100, 500). While they are open a driver in this process changes the
tenant's runs at a steady rate (``--rate`` a second, for ``--seconds``): it cancels
runs started before the window, each by ``agentruns.services.run_cancel`` as an
operator's button would (the engine's own commit and events; each page pushes the
run's row and the state tabs). For each N it prints:

- the database statements a second the pages cause: PostgreSQL's committed
  transactions for the database (``pg_stat_database.xact_commit``; every statement of
  the web process runs in autocommit, so one a statement) over the window, minus the
  same window measured with no page open (the driver's own), in the same run;
- the push latency from a run's commit (``run_cancel`` returned) to each page
  receiving a fragment that names the run: p50 and p95 over every (page, run) pair,
  and how many never arrived;
- the web process's RSS at the end of the window, and how many handshakes were
  retried (daphne drops one the application did not accept within 5 s) and how many
  pages opened at all (five tries each, all within 120 s).

Then the ratio N / the smallest N for statements and latency (the target: flat in N,
p50 under 100 ms). With ``--baseline DIR`` the same measurement is made, in the same
run, against the web process of another checkout (DIR/.venv/bin/daphne in DIR), for
example the commit before the follower, when every socket polled the logs itself.
pg_stat_statements is not used: it needs a server restart to load.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_watchers_bench \\
        .venv/bin/python benchmarks/watchers.py [--pages 1,100,500] [--rate 2] \\
        [--seconds 10] [--baseline /path/to/old/checkout]

The database must be a dedicated one (its name contains "bench"); it is created if
missing and migrated. The pages are clients in this one process, so a latency also
includes this process reading N sockets. A measurement, not a test: exit status 0
whatever the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.step_overhead import configure_environment  # noqa: E402

TENANT_SLUG = "bench-watchers"
USERNAME = "watchers-bench-viewer"
AGENT = "order_status"
# Pages opening at once: each connect waits for its snapshot, rendered on the web
# process's one database thread, within daphne's 5 s handshake timeout.
CONNECT_AT_ONCE = 3
CONNECT_TIMEOUT = 120.0
RUN_ID = re.compile(rb'id="run-([0-9a-f-]{36})"')


@dataclass
class Window:
    pages: int
    statements_per_second: float
    latencies: list[float] = field(default_factory=list)
    missed: int = 0
    retried: int = 0
    opened: int = 0
    rss_mb: float = 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


# --- the database side (this process) --------------------------------------------


def prepare() -> tuple[object, str]:
    """Migrate, make the tenant and its viewer, log them in; returns (tenant, cookie)."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from accounts.models import Operator, Tenant
    from benchmarks.step_overhead import ensure_postgres_database

    if connection.vendor != "postgresql":
        sys.exit("set DATABASE_URL to a dedicated PostgreSQL database (its name contains 'bench')")
    ensure_postgres_database(connection.settings_dict)
    call_command("migrate", verbosity=0, interactive=False)
    tenant, _ = Tenant.objects.get_or_create(slug=TENANT_SLUG, defaults={"name": "Watchers"})
    user = get_user_model().objects.filter(username=USERNAME).first()
    if user is None:
        user = get_user_model().objects.create_user(username=USERNAME, password="not-used-0")
        Operator.objects.create(user=user, tenant=tenant)
        user.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(user)
    return (
        tenant,
        f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}",
    )


def commits() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return cursor.fetchone()[0]


def start_runs(tenant, count: int) -> list:
    from agentruns.services import run_start

    return [
        run_start(tenant=tenant, agent_name=AGENT, input={"order_id": "ord_1001"})[0].id
        for _ in range(count)
    ]


class Driver(threading.Thread):
    """Cancels one of ``run_ids`` every 1/rate seconds; notes when each commit returned."""

    def __init__(self, run_ids: list, rate: float, committed: dict[bytes, float]):
        super().__init__(daemon=True)
        self.run_ids, self.rate, self.committed = run_ids, rate, committed

    def run(self) -> None:
        from django.db import connection

        from agentruns.services import run_cancel

        started = time.monotonic()
        for n, run_id in enumerate(self.run_ids):
            time.sleep(max(0.0, started + n / self.rate - time.monotonic()))
            run_cancel(run_id, by="user:watchers-bench")
            self.committed[str(run_id).encode()] = time.monotonic()
        connection.close()


# --- the web process --------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_web(checkout: Path, port: int, scratch: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "HOLDFAST_VAR_DIR": str(scratch),
        "HOLDFAST_MAX_SOCKETS_PER_USER": "10000",
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    daphne = checkout / ".venv" / "bin" / "daphne"
    web = subprocess.Popen(
        [str(daphne), "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
        cwd=checkout,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(scratch / f"web-{port}.log", "wb"),  # noqa: SIM115
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return web
        if web.poll() is not None:
            sys.exit(f"the web process exited: see {scratch / f'web-{port}.log'}")
        time.sleep(0.2)
    web.kill()
    sys.exit("the web process did not listen within 60 s")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# --- the pages: minimal websocket clients (RFC 6455, text frames) -------------------


class Page:
    def __init__(self, port: int, cookie: str, committed: dict[bytes, float], window: Window):
        self.port, self.cookie, self.committed, self.window = port, cookie, committed, window
        self.seen: set[bytes] = set()
        self.snapshot = asyncio.Event()

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        key = base64.b64encode(os.urandom(16)).decode()
        self.writer.write(
            (
                f"GET /ws/runs/ HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Origin: http://127.0.0.1:{self.port}\r\nCookie: {self.cookie}\r\n\r\n"
            ).encode()
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"handshake refused: {head[:80]!r}")
        self.task = asyncio.create_task(self._read())

    async def _frame(self) -> tuple[int, bytes]:
        first, second = await self.reader.readexactly(2)
        length = second & 0x7F
        if length == 126:
            length = int.from_bytes(await self.reader.readexactly(2), "big")
        elif length == 127:
            length = int.from_bytes(await self.reader.readexactly(8), "big")
        return first & 0x0F, await self.reader.readexactly(length)

    def _send(self, opcode: int, payload: bytes = b"") -> None:
        mask = os.urandom(4)
        masked = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
        self.writer.write(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked)

    async def _read(self) -> None:
        gone = (asyncio.IncompleteReadError, ConnectionError)
        try:
            while True:
                opcode, payload = await self._frame()
                now = time.monotonic()
                if opcode == 0x9:
                    self._send(0xA, payload)
                    continue
                if opcode == 0x8:
                    return
                if not self.snapshot.is_set():
                    self.snapshot.set()
                    continue
                for run_id in RUN_ID.findall(payload):
                    committed = self.committed.get(run_id)
                    if committed is not None and run_id not in self.seen:
                        self.seen.add(run_id)
                        self.window.latencies.append(now - committed)
        except gone:
            return

    async def close(self) -> None:
        try:
            self._send(0x8, (1000).to_bytes(2, "big"))
            await self.writer.drain()
            self.writer.close()
        except ConnectionError:
            pass
        self.task.cancel()


async def open_pages(n, port, cookie, committed, window) -> list[Page]:
    pages = [Page(port, cookie, committed, window) for _ in range(n)]
    gate = asyncio.Semaphore(CONNECT_AT_ONCE)

    async def one(page: Page) -> bool:
        async with gate:
            for _ in range(5):
                try:
                    await page.open()
                    await page.snapshot.wait()
                    return True
                except (ConnectionError, asyncio.IncompleteReadError):
                    # daphne drops a handshake the application did not accept within
                    # 5 s (a web process too busy); a browser retries the same way.
                    window.retried += 1
                    await asyncio.sleep(1.0)
            return False  # never opened: counted, not measured

    tasks = [asyncio.create_task(one(page)) for page in pages]
    _, late = await asyncio.wait(tasks, timeout=CONNECT_TIMEOUT)
    for task in late:
        # A web process too busy to open them all in time: measured with those open.
        task.cancel()
    await asyncio.gather(*late, return_exceptions=True)
    opened = [
        page
        for page, task in zip(pages, tasks, strict=True)
        if not task.cancelled() and task.result()
    ]
    for page in set(pages) - set(opened):
        if hasattr(page, "writer"):
            page.writer.close()  # half open: no part of the measurement
    return opened


async def measure(n, port, web, tenant, cookie, rate, seconds) -> Window:
    from channels.db import database_sync_to_async

    committed: dict[bytes, float] = {}
    window = Window(pages=n, statements_per_second=0.0)
    run_ids = await database_sync_to_async(start_runs)(tenant, int(rate * seconds))
    pages = await open_pages(n, port, cookie, committed, window) if n else []
    window.opened = len(pages)
    await asyncio.sleep(2.0)  # the snapshots' renders are over
    before, started = await database_sync_to_async(commits)(), time.monotonic()
    driver = Driver(run_ids, rate, committed)
    driver.start()
    await asyncio.to_thread(driver.join)
    await asyncio.sleep(2.0)  # the last pushes arrive
    after, ended = await database_sync_to_async(commits)(), time.monotonic()
    window.statements_per_second = (after - before) / (ended - started)
    window.missed = len(committed) * len(pages) - len(window.latencies)
    window.rss_mb = rss_mb(web.pid)
    for page in pages:
        await page.close()
    await asyncio.sleep(1.0)
    return window


def report(label: str, windows: list[Window], idle: float) -> None:
    first = windows[0]
    first_pages = max(first.statements_per_second - idle, 0.001)
    print(f"\n{label}")
    print(
        f"{'pages':>6} {'stmts/s (pages)':>16} {'x first':>8} {'p50 ms':>8} {'p95 ms':>8}"
        f" {'x first p50':>12} {'missed':>7} {'RSS MB':>8} {'retried':>8} {'opened':>7}"
    )
    for w in windows:
        by_pages = w.statements_per_second - idle
        print(
            f"{w.pages:>6} {by_pages:>16.1f} {by_pages / first_pages:>8.2f}"
            f" {w.percentile(0.5):>8.1f} {w.percentile(0.95):>8.1f}"
            f" {w.percentile(0.5) / first.percentile(0.5):>12.2f} {w.missed:>7} {w.rss_mb:>8.1f}"
            f" {w.retried:>8} {w.opened:>7}"
        )


def run_checkout(label, checkout, counts, tenant, cookie, rate, seconds, scratch) -> None:
    port = free_port()
    web = start_web(checkout, port, scratch)
    try:

        async def all_windows() -> tuple[float, list[Window]]:
            idle = await measure(0, port, web, tenant, cookie, rate, seconds)
            return idle.statements_per_second, [
                await measure(n, port, web, tenant, cookie, rate, seconds) for n in counts
            ]

        idle, windows = asyncio.run(all_windows())
    finally:
        web.terminate()
        web.wait(timeout=10)
    print(f"\n{label}: {checkout}; with no page open the driver alone: {idle:.1f} statements/s")
    report(label, windows, idle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", default="1,100,500")
    parser.add_argument("--rate", type=float, default=2.0, help="runs started a second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--baseline", type=Path, help="another checkout to measure the same way")
    args = parser.parse_args()
    counts = [int(n) for n in args.pages.split(",")]
    scratch = configure_environment()
    tenant, cookie = prepare()
    print(
        f"{args.rate:g} runs a second for {args.seconds:g} s per window; pages {counts}; "
        "the machine may be shared and busy: compare ratios within this run"
    )
    run_checkout("this checkout", ROOT, counts, tenant, cookie, args.rate, args.seconds, scratch)
    if args.baseline:
        run_checkout(
            "baseline", args.baseline, counts, tenant, cookie, args.rate, args.seconds, scratch
        )


if __name__ == "__main__":
    main()

from __future__ import annotations

import logging
from wsgiref.simple_server import WSGIRequestHandler, make_server

from django.core.management.base import BaseCommand
from prometheus_client import make_wsgi_app

from config import metrics

log = logging.getLogger("holdfast.metrics")


class _QuietHandler(WSGIRequestHandler):
    # One line per scrape would drown the host's logs.
    def log_message(self, format, *args):
        pass


def metrics_app(*, database: bool):
    """The Prometheus WSGI app over this host's processes, behind HOLDFAST_METRICS_TOKEN."""
    serve = make_wsgi_app(metrics.registry(database=database))

    def app(environ, start_response):
        if not metrics.token_accepted(environ.get("HTTP_AUTHORIZATION", "")):
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Bearer realm="metrics"')],
            )
            return [b"a bearer token is required\n"]
        return serve(environ, start_response)

    return app


class Command(BaseCommand):
    help = (
        "Serve this host's metrics for Prometheus (every process's, from "
        "PROMETHEUS_MULTIPROC_DIR) on a host with no web process, e.g. one that runs only "
        "workers. The web process serves the same at /metrics, with the database's "
        "aggregates; --database adds those here too."
    )

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=9108)
        parser.add_argument("--addr", default="0.0.0.0")  # noqa: S104 (scraped from outside)
        parser.add_argument(
            "--database",
            action="store_true",
            help="also read runs, approvals, cases, the sweeper's lease and the queue "
            "from the database (once per deployment is enough: every host reads the same)",
        )

    def handle(self, *args, port: int, addr: str, database: bool, **options):
        server = make_server(
            addr, port, metrics_app(database=database), handler_class=_QuietHandler
        )
        log.info("serving metrics on %s:%d", addr, server.server_port)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()

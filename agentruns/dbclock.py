"""The database's clock, as one expression for the ORM and the engine's own SQL.

Every comparison of timestamps happens in SQL with the database's clock
(DESIGN §12.10). PostgreSQL: ``statement_timestamp()`` (``now()`` is fixed at
transaction start). SQLite: ``'now'`` padded to microseconds, so the text it
writes has exactly the shape Django writes for a datetime and equal instants
compare equal as text.
"""

from __future__ import annotations

from django.db.models import DateTimeField, Func

SQLITE_FORMAT = "%Y-%m-%d %H:%M:%f"
SQLITE_NOW = f"(strftime('{SQLITE_FORMAT}', 'now') || '000')"
SQLITE_NOW_PLUS = "(strftime('%Y-%m-%d %H:%M:%f', 'now', {modifier}) || '000')"
POSTGRES_NOW = "statement_timestamp()"


def now_sql(vendor: str) -> str:
    """The database's clock as an SQL expression, for statements written by hand."""
    return POSTGRES_NOW if vendor == "postgresql" else SQLITE_NOW


def now_plus_sql(vendor: str, seconds: float, params: list) -> str:
    """The database's clock plus ``seconds``, its one parameter appended to ``params``."""
    if vendor == "postgresql":
        params.append(float(seconds))
        return "(statement_timestamp() + make_interval(secs => %s))"
    params.append(f"{seconds:+.3f} seconds")
    return SQLITE_NOW_PLUS.format(modifier="%s")


class DbNow(Func):
    template = "CURRENT_TIMESTAMP"
    output_field = DateTimeField()

    def as_postgresql(self, compiler, connection, **extra_context):
        return self.as_sql(compiler, connection, template=POSTGRES_NOW, **extra_context)

    def as_sqlite(self, compiler, connection, **extra_context):
        # The format is a bound parameter: SQL text with no % in it reads the same to
        # every layer that formats it (Django's cursor, DEBUG's query log, an outer Func).
        return "(strftime(%s, 'now') || '000')", [SQLITE_FORMAT]

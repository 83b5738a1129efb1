"""Fixed reads of one run's rows, compiled once per process, their rows made into models
without Django's per-query machinery.

A worker reads its run before the claim and the run's steps after it, on every claim;
the run-ended hook reads the run once more. Through the ORM each read built its query
(more CPU than running it), and through ``raw()`` each still resolved its columns,
their converters and the model's init order (about 40 column objects for the run
table) on every call: together about a third of a worker's CPU per run. Here all of
that is done the first time a read is used, from the read's queryset, which stays the
source (a column added to the model is read too); each later call binds the run id,
fetches, converts each row as Django would (``SQLCompiler.apply_converters``) and
builds the model with ``Model.from_db``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import Model, QuerySet

from agentruns.models import Run

# The run id a read is compiled with, replaced by the one it reads.
_ANY_RUN = uuid.UUID(int=0)


@dataclass(frozen=True)
class CompiledRead:
    model: type[Model]
    sql: str
    params: tuple[Any, ...]
    run_slot: int
    init_list: tuple[str, ...]
    # (column index, (converters, expression)), as SQLCompiler.get_converters gives them.
    converters: tuple[tuple[int, tuple[list[Callable], Any]], ...]
    alias: str

    def params_for(self, run_id: uuid.UUID) -> list[Any]:
        params = list(self.params)
        params[self.run_slot] = _bound(run_id, self.alias)
        return params

    def models(self, rows: Sequence[Sequence[Any]]) -> list[Model]:
        connection = connections[self.alias]
        made = []
        for row in rows:
            values = list(row)
            for index, (converters, expression) in self.converters:
                value = values[index]
                for converter in converters:
                    value = converter(value, expression, connection)
                values[index] = value
            made.append(self.model.from_db(self.alias, self.init_list, values))
        return made

    def fetch(self, run_id: uuid.UUID) -> list[Model]:
        """Run the read through Django's cursor (the caller's connection, as any query)."""
        with connections[self.alias].cursor() as cursor:
            cursor.execute(self.sql, self.params_for(run_id))
            return self.models(cursor.fetchall())


_COMPILED: dict[tuple[str, str], CompiledRead] = {}


def compiled_read(
    name: str, queryset: Callable[[uuid.UUID], QuerySet], alias: str = "default"
) -> CompiledRead:
    """The read ``name``: ``queryset(run_id)`` compiled once per process and alias.

    The queryset must select one model's columns (no ``select_related``, no
    annotations) and take the run id as its only varying parameter.
    """
    key = (alias, name)
    read = _COMPILED.get(key)
    if read is None:
        read = _COMPILED[key] = _compile(name, queryset(_ANY_RUN), alias)
    return read


def _compile(name: str, queryset: QuerySet, alias: str) -> CompiledRead:
    compiler = queryset.query.get_compiler(using=alias)
    sql, params = compiler.as_sql()
    bound = _bound(_ANY_RUN, alias)
    slots = [index for index, value in enumerate(params) if value == bound]
    if len(slots) != 1:
        raise ValueError(f"the {name} read must take the run id once, not {params!r}")
    klass_info = compiler.klass_info
    if compiler.annotation_col_map or klass_info.get("related_klass_infos"):
        raise ValueError(f"the {name} read must select one model's columns alone")
    fields = klass_info["select_fields"]
    if fields != list(range(len(compiler.select))):
        raise ValueError(f"the {name} read must select its model's columns only")
    columns = [selected[0] for selected in compiler.select]
    return CompiledRead(
        model=klass_info["model"],
        sql=sql,
        params=tuple(params),
        run_slot=slots[0],
        init_list=tuple(column.target.attname for column in columns),
        converters=tuple(compiler.get_converters(columns).items()),
        alias=alias,
    )


def _bound(run_id: uuid.UUID, alias: str) -> Any:
    """A run id as the connection takes it (a UUID on PostgreSQL, hex text on SQLite)."""
    return Run._meta.pk.get_db_prep_value(run_id, connections[alias])

"""Rows of unsaved model instances as SQL an admission writes in one statement.

``Model.save()`` builds its INSERT through Django's compiler on every call (each
field's value resolved, prepared and quoted, the statement assembled): for a run,
about two thirds of the CPU admission spent. The columns are fixed per model, so
they are worked out once per process; each row then takes each field's value as
``save()`` would (``pre_save`` on add, ``get_db_prep_save``), a plain database default is
written as its value, and a database expression (the database's clock, ``DbNow``) is
compiled as Django compiles it; the caller reads that column back if it needs it.
A column added to the model is written too: the field list comes from its meta.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Field, Model
from django.db.models.expressions import DatabaseDefault
from django.db.models.sql import InsertQuery


@dataclass(frozen=True)
class _Columns:
    fields: tuple[Field, ...]
    names: str


_COLUMNS: dict[tuple[str, type[Model]], _Columns] = {}


def _columns(model: type[Model], connection) -> _Columns:
    key = (connection.alias, model)
    found = _COLUMNS.get(key)
    if found is None:
        meta = model._meta
        # As Model._save_table does: every local concrete column but a database-made
        # auto id (an id the model makes itself, a run's UUID, is written).
        fields = tuple(
            field
            for field in meta.local_concrete_fields
            if field is not meta.auto_field and not getattr(field, "generated", False)
        )
        names = ", ".join(connection.ops.quote_name(field.column) for field in fields)
        found = _COLUMNS[key] = _Columns(fields, names)
    return found


def insert_sql(obj: Model, connection) -> tuple[str, list[Any]]:
    """``INSERT INTO table (columns) VALUES (...)`` for ``obj``, and its parameters."""
    model = type(obj)
    columns = _columns(model, connection)
    placeholders: list[str] = []
    params: list[Any] = []
    compiler = None
    for field in columns.fields:
        value = field.pre_save(obj, add=True)
        if isinstance(value, DatabaseDefault) and not hasattr(
            field.db_default, "resolve_expression"
        ):
            # A plain database default ("" or False): written as its value, and the
            # object holds it, as save() leaves it after reading the row's default back.
            value = field.db_default
            setattr(obj, field.attname, value)
        if hasattr(value, "resolve_expression"):
            if compiler is None:
                query = InsertQuery(model)
                compiler = query.get_compiler(connection=connection)
            sql, expression_params = compiler.compile(
                value.resolve_expression(compiler.query, allow_joins=False, for_save=True)
            )
            placeholders.append(sql)
            params.extend(expression_params)
        else:
            placeholders.append("%s")
            params.append(field.get_db_prep_save(value, connection=connection))
    table = connection.ops.quote_name(model._meta.db_table)
    return f"INSERT INTO {table} ({columns.names}) VALUES ({', '.join(placeholders)})", params


def saved(obj: Model, alias: str) -> None:
    """Mark ``obj`` as the saved row it now is: a later ``save()`` updates it."""
    obj._state.adding = False
    obj._state.db = alias

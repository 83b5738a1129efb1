"""Rows of unsaved model instances as SQL an admission writes in one statement.

``Model.save()`` builds its INSERT through Django's compiler on every call (each
field's value resolved, prepared and quoted, the statement assembled): for a run,
about two thirds of the CPU admission spent. The columns are fixed per model, so
they are worked out once per process; each row then takes each field's value as
``save()`` would (``pre_save`` on add, ``get_db_prep_save``), a plain database default is
written as its value, and a database expression (the database's clock, ``DbNow``) is
compiled as Django compiles it; the caller reads that column back if it needs it.
A column added to the model is written too: the field list comes from its meta.

Most of a run's columns are strings, numbers, flags and empty times, for which Django's
preparation returns the value it was given (an integer wrapped in the backend's integer
type on PostgreSQL): those fields (by their exact class, with a value of the type they
hold, or None) skip the rest of it, which was a third of building the row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import models
from django.db.models import Field, Model
from django.db.models.expressions import DatabaseDefault
from django.db.models.sql import InsertQuery

# Fields whose pre_save is the attribute and whose preparation returns a value of this
# type (or None) unchanged: Django's own would only hand it back.
_AS_GIVEN: dict[type[Field], type] = {
    models.CharField: str,
    models.TextField: str,
    models.BooleanField: bool,
    models.IntegerField: int,
    models.SmallIntegerField: int,
    models.BigIntegerField: int,
    models.PositiveIntegerField: int,
    models.PositiveSmallIntegerField: int,
    models.PositiveBigIntegerField: int,
}


def _as_given(field: Field) -> type | None:
    """The type of value ``field`` writes as given, ``type(None)`` if only None, or None."""
    found = _AS_GIVEN.get(type(field))
    if found is not None:
        return found
    if type(field) is models.DateTimeField and not (field.auto_now or field.auto_now_add):
        return type(None)  # an empty time: NULL, as Django prepares it
    return None


@dataclass(frozen=True)
class _Columns:
    fields: tuple[Field, ...]
    as_given: tuple[type | None, ...]
    internal_types: tuple[str, ...]
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
        found = _COLUMNS[key] = _Columns(
            fields,
            tuple(_as_given(field) for field in fields),
            tuple(field.get_internal_type() for field in fields),
            names,
        )
    return found


def insert_sql(obj: Model, connection) -> tuple[str, list[Any]]:
    """``INSERT INTO table (columns) VALUES (...)`` for ``obj``, and its parameters."""
    model = type(obj)
    columns = _columns(model, connection)
    placeholders: list[str] = []
    params: list[Any] = []
    compiler = None
    adapt_integer = connection.ops.adapt_integerfield_value
    for field, as_given, internal_type in zip(
        columns.fields, columns.as_given, columns.internal_types, strict=True
    ):
        if as_given is not None:
            value = getattr(obj, field.attname)
            if value is None or type(value) is as_given:
                placeholders.append("%s")
                params.append(adapt_integer(value, internal_type) if as_given is int else value)
                continue
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

"""On PostgreSQL, a committed RunEvent or AuditEntry wakes the live pages: each insert
statement notifies the channel ``holdfast_live`` once per tenant it touched, with the
tenant's id as the payload (agentruns.follower listens).

A trigger, not the write helpers: every writer of either table is covered at once (the
engine's Store with its data-modifying CTEs, the ORM's ``audit_record``, a bulk load, a
statement typed in psql), the engine's hot statement stays as it is, and ``pg_notify``
inside the writing transaction is delivered on commit and never for a rollback.
SQLite has no NOTIFY: its pages poll (agentruns.follower), so nothing is created there.
"""

from django.db import migrations

CREATE = """
CREATE FUNCTION holdfast_live_runevent() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    tenant bigint;
BEGIN
    -- One notification per tenant per statement; PostgreSQL also folds identical
    -- ones within a transaction.
    FOR tenant IN
        SELECT DISTINCT run.tenant_id
        FROM holdfast_new_events AS event JOIN agentruns_run AS run ON run.id = event.run_id
    LOOP
        PERFORM pg_notify('holdfast_live', tenant::text);
    END LOOP;
    RETURN NULL;
END
$$;
CREATE TRIGGER runevent_notify_live
    AFTER INSERT ON agentruns_runevent
    REFERENCING NEW TABLE AS holdfast_new_events
    FOR EACH STATEMENT EXECUTE FUNCTION holdfast_live_runevent();

CREATE FUNCTION holdfast_live_auditentry() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    tenant bigint;
BEGIN
    FOR tenant IN SELECT DISTINCT tenant_id FROM holdfast_new_entries LOOP
        PERFORM pg_notify('holdfast_live', tenant::text);
    END LOOP;
    RETURN NULL;
END
$$;
CREATE TRIGGER auditentry_notify_live
    AFTER INSERT ON accounts_auditentry
    REFERENCING NEW TABLE AS holdfast_new_entries
    FOR EACH STATEMENT EXECUTE FUNCTION holdfast_live_auditentry();
"""

DROP = """
DROP TRIGGER IF EXISTS runevent_notify_live ON agentruns_runevent;
DROP FUNCTION IF EXISTS holdfast_live_runevent();
DROP TRIGGER IF EXISTS auditentry_notify_live ON accounts_auditentry;
DROP FUNCTION IF EXISTS holdfast_live_auditentry();
"""


def create_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0010_tenant_retention"),
        ("agentruns", "0009_run_archive"),
    ]

    operations = [migrations.RunPython(create_triggers, drop_triggers)]

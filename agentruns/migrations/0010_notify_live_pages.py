"""On PostgreSQL, a committed AuditEntry wakes the live pages: each insert statement
notifies the channel ``holdfast_live`` once per tenant it touched, with the tenant's id
as the payload (agentruns.follower listens).

A trigger, not the write helper: every writer of the table is covered (``audit_record``,
a bulk load, a statement typed in psql), and ``pg_notify`` inside the writing
transaction is delivered on commit and never for a rollback. Audit entries come from
people's actions and lookups, a few a second at most, so the notification queue's lock
that a notifying commit takes costs nothing that matters. The engine's RunEvents, one
with nearly every step, are announced after their commit instead
(agentruns/doorbell.py says why). SQLite has no NOTIFY: its pages poll
(agentruns.follower), so nothing is created there.
"""

from django.db import migrations

CREATE = """
CREATE FUNCTION holdfast_live_auditentry() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    tenant bigint;
BEGIN
    -- One notification per tenant per statement; PostgreSQL also folds identical
    -- ones within a transaction.
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
DROP TRIGGER IF EXISTS auditentry_notify_live ON accounts_auditentry;
DROP FUNCTION IF EXISTS holdfast_live_auditentry();
"""


def create_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0010_tenant_retention"),
        ("agentruns", "0009_run_archive"),
    ]

    operations = [migrations.RunPython(create_trigger, drop_trigger)]

from django.db import migrations

# Every step commit updates the run row. On PostgreSQL, moving the large JSON
# columns (the pinned agent snapshot, the input) out of line keeps that row
# small, and free space on each page lets an update that changes no indexed
# column stay on its page (a HOT update, no index writes). Steps are updated once
# or twice after their insert (an effect's answer), so they get some room too.
TUNE = """
ALTER TABLE agentruns_run SET (fillfactor = 70, toast_tuple_target = 256);
ALTER TABLE agentruns_run ALTER COLUMN agent_snapshot SET STORAGE EXTERNAL;
ALTER TABLE agentruns_run ALTER COLUMN input SET STORAGE EXTERNAL;
ALTER TABLE agentruns_step SET (fillfactor = 80);
"""
UNTUNE = """
ALTER TABLE agentruns_run RESET (fillfactor, toast_tuple_target);
ALTER TABLE agentruns_run ALTER COLUMN agent_snapshot SET STORAGE EXTENDED;
ALTER TABLE agentruns_run ALTER COLUMN input SET STORAGE EXTENDED;
ALTER TABLE agentruns_step RESET (fillfactor);
"""


def tune(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(TUNE)


def untune(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(UNTUNE)


class Migration(migrations.Migration):
    dependencies = [("agentruns", "0001_initial")]

    operations = [migrations.RunPython(tune, untune)]

from django.db import migrations


def create_default_tenant(apps, schema_editor):
    Tenant = apps.get_model("accounts", "Tenant")
    Tenant.objects.get_or_create(slug="default", defaults={"name": "Default"})


class Migration(migrations.Migration):
    dependencies = [("accounts", "0001_initial")]

    operations = [migrations.RunPython(create_default_tenant, migrations.RunPython.noop)]

from django.contrib.auth.management import create_permissions
from django.db import migrations

# Who manages a tenant's webhook endpoints (and reads their delivery log): its admins.
GRANTS = {
    "admin": ["manage_webhooks"],
}


def grant_manage_webhooks(apps, schema_editor):
    # As accounts' create_operator_groups: the permission is needed before post_migrate.
    webhooks = apps.get_app_config("webhooks")
    webhooks.models_module = True
    create_permissions(webhooks, apps=apps, verbosity=0)
    webhooks.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, codenames in GRANTS.items():
        group = Group.objects.filter(name=name).first()
        if group is not None:
            group.permissions.add(
                *Permission.objects.filter(
                    content_type__app_label="webhooks", codename__in=codenames
                )
            )


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0001_initial"),
        ("accounts", "0008_provider_error_permission"),
    ]

    operations = [migrations.RunPython(grant_manage_webhooks, migrations.RunPython.noop)]

from django.contrib.auth.management import create_permissions
from django.db import migrations

# Who reads a provider's own error text: the people who act on providers.
GRANTS = {
    "operator": ["view_provider_errors"],
    "reconciler": ["view_provider_errors"],
    "admin": ["view_provider_errors"],
}


def grant_provider_errors(apps, schema_editor):
    # As in create_operator_groups: the permission is needed before post_migrate.
    accounts = apps.get_app_config("accounts")
    accounts.models_module = True
    create_permissions(accounts, apps=apps, verbosity=0)
    accounts.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, codenames in GRANTS.items():
        group = Group.objects.filter(name=name).first()
        if group is not None:
            group.permissions.add(
                *Permission.objects.filter(
                    content_type__app_label="accounts", codename__in=codenames
                )
            )


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0007_provideraccount"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="operator",
            options={
                "permissions": [
                    ("view_runs", "Can see the tenant's runs"),
                    ("start_runs", "Can start runs"),
                    ("cancel_runs", "Can cancel runs"),
                    ("retry_runs", "Can make a waiting run retry now"),
                    ("decide_approvals", "Can approve or reject actions"),
                    ("settle_effects", "Can settle effects whose outcome is unknown"),
                    ("view_audit", "Can read the audit log"),
                    ("view_provider_errors", "Can read providers' own error messages"),
                ]
            },
        ),
        migrations.RunPython(grant_provider_errors, migrations.RunPython.noop),
    ]

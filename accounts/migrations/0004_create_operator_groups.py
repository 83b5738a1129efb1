from django.contrib.auth.management import create_permissions
from django.db import migrations

GROUPS = {
    "viewer": ["view_runs"],
    "operator": ["view_runs", "start_runs", "cancel_runs", "retry_runs"],
    "approver": ["view_runs", "decide_approvals"],
    "reconciler": ["view_runs", "settle_effects"],
    "admin": [
        "view_runs",
        "start_runs",
        "cancel_runs",
        "retry_runs",
        "decide_approvals",
        "settle_effects",
        "view_audit",
    ],
}


def create_operator_groups(apps, schema_editor):
    # Permissions are normally created after all migrations; these groups need
    # them now.
    accounts = apps.get_app_config("accounts")
    accounts.models_module = True
    create_permissions(accounts, apps=apps, verbosity=0)
    accounts.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, codenames in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.set(
            Permission.objects.filter(content_type__app_label="accounts", codename__in=codenames)
        )


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0003_apitoken_operator_auditentry"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_operator_groups, migrations.RunPython.noop)]

from django.apps import AppConfig


class BulkConfig(AppConfig):
    name = "bulk"
    verbose_name = "Bulk actions"

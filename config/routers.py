from __future__ import annotations

from django.conf import settings


class QueueRouter:
    """Keeps django-q2's tables in the ``queue`` database when one is configured.

    On SQLite the queue has its own file so the broker's polling writes never
    contend with the engine's step commits for the single write lock.
    """

    app_label = "django_q"

    def _queue_alias(self) -> str | None:
        return "queue" if "queue" in settings.DATABASES else None

    def db_for_read(self, model, **hints):
        if model._meta.app_label == self.app_label:
            return self._queue_alias()
        return None

    db_for_write = db_for_read

    def allow_relation(self, obj1, obj2, **hints):
        return None

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        alias = self._queue_alias()
        if alias is None:
            return None
        if app_label == self.app_label:
            return db == alias
        return False if db == alias else None


class SandboxRouter:
    """The sandbox's tables live only in the ``sandbox`` database, and only they do."""

    app_label = "sandbox"

    def db_for_read(self, model, **hints):
        if model._meta.app_label == self.app_label:
            return "sandbox"
        return None

    db_for_write = db_for_read

    def allow_relation(self, obj1, obj2, **hints):
        return None

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        if app_label == self.app_label:
            return db == "sandbox"
        if db == "sandbox":
            return False
        return None

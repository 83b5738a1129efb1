from django.apps import AppConfig


class AgentrunsConfig(AppConfig):
    name = "agentruns"
    verbose_name = "Agent runs"

    def ready(self) -> None:
        from django_q.signals import post_spawn

        from agentruns import shutdown

        # Each django-q2 worker process hands its run back on SIGTERM (agentruns.shutdown).
        post_spawn.connect(shutdown.install, dispatch_uid="holdfast-worker-shutdown")

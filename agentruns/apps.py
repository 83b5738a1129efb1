from django.apps import AppConfig


class AgentrunsConfig(AppConfig):
    name = "agentruns"
    verbose_name = "Agent runs"

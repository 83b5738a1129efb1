from django.apps import AppConfig


class HoldfastConfig(AppConfig):
    """The composition root as an app: it wires the others together once they are loaded,
    and holds the commands that need every app (``seeddemo``)."""

    name = "config"
    label = "holdfast"
    verbose_name = "Holdfast"

    def ready(self) -> None:
        from config import wiring

        wiring.install()

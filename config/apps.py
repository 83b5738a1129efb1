from django.apps import AppConfig


class HoldfastConfig(AppConfig):
    """The composition root as an app: it wires the others together once they are loaded,
    and holds the commands that need every app (``seeddemo``)."""

    name = "config"
    label = "holdfast"
    verbose_name = "Holdfast"

    def ready(self) -> None:
        # Imported here, not at the top: the wiring imports the apps' models, which
        # Django loads only after every AppConfig is created.
        from config import wiring

        wiring.install()

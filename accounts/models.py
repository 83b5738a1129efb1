from __future__ import annotations

from django.db import models

DEFAULT_TENANT_SLUG = "default"


class Tenant(models.Model):
    """An organisation whose runs, operators and settings are kept apart from every other's."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name or self.slug

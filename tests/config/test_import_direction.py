"""Which way the imports run (docs/architecture.md, "The module map").

Every import of the project's own packages is read from the source, at any
depth (inside functions too), so a circle cannot hide in a function body.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "accounts",
    "agentruns",
    "approvals",
    "reconciliation",
    "evidence",
    "retention",
    "overview",
    "bulk",
    "notifications",
    "webhooks",
    "api",
    "support",
    "examples",
    "sandbox",
    "config",
)
# What each app may import of the others. config is the composition root and
# knows every app; nothing imports it (settings are read through django.conf).
ALLOWED = {
    "accounts": set(),
    "agentruns": {"accounts"},
    "approvals": {"accounts", "agentruns"},
    "reconciliation": {"accounts", "agentruns"},
    # A run's evidence reads the run, its approvals and its cases together.
    "evidence": {"accounts", "agentruns", "approvals", "reconciliation"},
    # Retention keeps a run that has an open case or an unconsumed approval.
    "retention": {"accounts", "agentruns", "approvals", "reconciliation"},
    # The overview draws runs, approvals and cases of a range together.
    "overview": {"accounts", "agentruns", "approvals", "reconciliation"},
    # Cancels or retries many runs through the same service calls as one.
    "bulk": {"accounts", "agentruns"},
    # Tells the people who may act on an approval or a case.
    "notifications": {"accounts", "agentruns", "approvals", "reconciliation"},
    # Tells a tenant's systems of runs, approvals and cases, on notifications' path.
    "webhooks": {"accounts", "agentruns", "approvals", "reconciliation", "notifications"},
    # The API (api/v1.py) serves what the console does, through the same selectors and
    # services; nothing below it imports it.
    "api": {"accounts", "agentruns", "approvals", "reconciliation"},
    "support": {"agentruns"},
    "examples": {"agentruns"},
    "sandbox": set(),
    "config": set(PACKAGES) - {"config"},
}
# An agent is an ordinary user of the runtime: its public surface, the scripted model
# client, the one money formatter every amount is shown with, the one mail sender, and
# the integrations that run agents written with other frameworks.
AGENT_SURFACE = (
    "agentruns.runtime",
    "agentruns.llm.scripted",
    "agentruns.money",
    "agentruns.mail",
    "agentruns.integrations.pydantic_ai",
)
# An integration is a user of the runtime too: its public surface, and the model errors
# the engine retries by (agentruns.llm.base).
INTEGRATION_SURFACE = ("agentruns.runtime", "agentruns.llm.base")


def _imports(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
    return found


def _modules(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" not in path.parts:
            yield path


@pytest.mark.parametrize("package", PACKAGES)
def test_an_app_imports_only_the_apps_below_it(package):
    wrong = []
    for path in _modules(package):
        for module, line in _imports(path):
            top = module.split(".")[0]
            if top in PACKAGES and top != package and top not in ALLOWED[package]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert wrong == []


@pytest.mark.parametrize("package", ["support", "examples"])
def test_an_agent_uses_only_the_runtimes_public_surface(package):
    wrong = []
    for path in _modules(package):
        for module, line in _imports(path):
            if module.startswith("agentruns") and module not in AGENT_SURFACE:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert wrong == []


def test_an_integration_uses_only_the_runtimes_public_surface():
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _modules("agentruns/integrations")
        for module, line in _imports(path)
        if module.split(".")[0] in PACKAGES and module not in INTEGRATION_SURFACE
    ]
    assert wrong == []


def test_the_runtime_knows_no_http_views_or_templates():
    forbidden = (
        "django.http",
        "django.shortcuts",
        "django.template",
        "django.views",
        "agentruns.views",
        "agentruns.selectors",
        "agentruns.consumers",
        "agentruns.services",
        "agentruns.sweeper",
    )
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _modules("agentruns/runtime")
        for module, line in _imports(path)
        if module.startswith(forbidden)
    ]
    assert wrong == []

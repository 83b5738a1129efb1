"""Agents written with other frameworks, run as Holdfast agents.

Each integration uses only the runtime's public surface (``agentruns.runtime``)
and the framework's own public interfaces.
"""

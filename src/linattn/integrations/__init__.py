"""Bridges to other libraries. Each submodule imports its library only when used (optional extras)."""

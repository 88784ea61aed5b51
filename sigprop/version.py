"""The version, in one place (pyproject.toml reads it; results record it)."""

__version__ = "0.19.0.dev0"

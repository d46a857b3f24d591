"""A Datasette-style, read-only window on the GPUlayer state file (docs/explorer.md)."""
from .app import create_app
from .server import serve

__all__ = ["create_app", "serve"]

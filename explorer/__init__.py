"""A Datasette-style, read-only window on the GPUlayer state file (docs/explorer.md)."""
from .app import create_app
from .server import Exposed, serve

__all__ = ["Exposed", "create_app", "serve"]

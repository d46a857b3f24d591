"""A Datasette-style, read-only window on the GPUlayer state file (docs/explorer.md)."""
from .app import create_app
from .server import Exposed, home_client_auth, serve

__all__ = ["Exposed", "create_app", "home_client_auth", "serve"]

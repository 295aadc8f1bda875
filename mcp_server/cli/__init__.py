"""The `loopwright` command line."""
from mcp_server.cli.main import main

__all__ = ["main"]

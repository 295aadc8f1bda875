"""loopwright: a closed research loop for coding agents (MCP server + hooks)."""

__version__ = "0.1.0"

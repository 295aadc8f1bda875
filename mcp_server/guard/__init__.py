"""Hooks for Claude Code and Codex: the friendly first line (stdlib only, fail closed)."""
from mcp_server.guard.hook import main

__all__ = ["main"]

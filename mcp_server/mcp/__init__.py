"""The MCP face of the loop: a thin server over the engine."""

"""The `loopwright` commands, one module per topic; mcp_server/cli/registry.py says which is where."""

"""Drive the real claude / codex CLIs offline against scripted fake model servers (see README.md)."""

"""Who drives the loop: the built-in proposer, the headless launchers of Claude Code / Codex."""

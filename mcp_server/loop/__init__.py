"""The loop: workspace and config, the engine, the runner and evaluator, verdicts, budgets,
integrity checks and git. Everything a keep or a discard depends on lives here."""

"""Mechanisms shipped for the built-in outer loop. Each file is a runtime mechanism (the interface
in base.py: advise(history dict, source) -> dict), validated and run in the sandbox like one an
outer agent proposes; never imported by loopwright itself."""

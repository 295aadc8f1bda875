"""What every layer shares, each fact in one place: client wiring facts (facts.py), process
groups (procs.py), file locks (locks.py). Standard library only: the guard imports from here."""

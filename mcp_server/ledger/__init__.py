"""The ledger: the loop's SQLite state. The only place in loopwright that speaks SQL."""

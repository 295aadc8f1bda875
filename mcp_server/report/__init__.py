"""Human-facing output: progress.png, report.md, results.tsv."""

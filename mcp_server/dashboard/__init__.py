"""`loopwright dashboard`: a live browser view of one or more campaigns, with Approve / Reject.

data.py reads (ledger API, engine read-only), actions.py decides (loop/decisions.py, as Slack, Jira and
the CLI do), auth.py says who may do what, views.py renders escaped HTML, app.py wires the routes.
"""

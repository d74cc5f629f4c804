"""What a run shows: metrics.jsonl, samples and the progress bar (``runlog.py``), metric sinks
(``loggers.py``), health checks (``diagnostics.py``), the HTML report and the planner."""

"""paraflow/bench/report."""

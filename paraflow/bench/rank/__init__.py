"""paraflow/bench/rank."""

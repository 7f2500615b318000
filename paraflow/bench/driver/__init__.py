"""paraflow/bench/driver."""

"""paraflow/training."""

"""paraflow/reliability."""

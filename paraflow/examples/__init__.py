"""paraflow/examples."""

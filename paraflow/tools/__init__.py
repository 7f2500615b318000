"""paraflow/tools."""

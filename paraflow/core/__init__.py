"""The Backend contract, its common options, device and thread placement, and the registry."""

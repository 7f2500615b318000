"""Who this process is: rank, world size, local rank and rank 0's address, read from the launcher.

Knows environment variables and mpi4py only, never a backend. One `Launcher` object per
launcher, a module each, in `paraflow.environment.launchers`; rank 0's address for launchers
that do not set it in `paraflow.environment.rendezvous`.
"""

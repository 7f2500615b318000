"""Other libraries' APIs on paraflow's backends: ``paraflow.compat.horovod`` is ``horovod.torch``'s."""

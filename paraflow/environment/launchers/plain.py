"""No launcher: one process, or ranks started by hand (read last, when no launcher's rank is set)."""

from __future__ import annotations

from collections.abc import Mapping

from ...errors import ConfigurationError
from .base import Identity, Launcher

__all__ = ["Plain"]


class Plain(Launcher):
    name = "python"
    command = "python train.py"
    label = "no launcher (plain python)"
    is_plain = True
    tool = "python"
    comes_with_torch = True

    def detect(self, env: Mapping[str, str]) -> bool:
        return True

    def identity(self, env: Mapping[str, str]) -> Identity:
        return Identity(0, 1, 0, 1)

    def launch_command(self, python, nproc, script, *, port, env_keys, hosts, node_rank, must_exist) -> list[str]:
        if nproc != 1 or (hosts and len(hosts) > 1):
            raise ConfigurationError("the python launcher starts exactly one process, on this host.")
        return [python, *script]

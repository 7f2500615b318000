"""The `ssh` stand-in: what launchers call to reach another host, here a namespace instead.

Open MPI runs its rsh agent as ``AGENT HOST COMMAND...`` and horovodrun runs
``ssh -o ... HOST COMMAND``; both hand the remote shell one command line. The stand-in does what
sshd does with it: a fresh login environment (no variable of the caller leaks through, so the
launcher's own forwarding, ``mpirun -x`` or horovodrun's exports, is what a rank gets), the
host's name, and ``sh -c`` of the joined arguments, in the host's network namespace.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

__all__ = ["LOGIN_PATH", "write_ssh_agent"]

#: The PATH sshd gives a login on Debian; what every remote command starts with.
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_TEMPLATE = """#!/bin/sh
# ssh stand-in for the emulated cluster {cluster}: runs the command inside the host's network
# namespace, under the host's name, in a fresh login environment. Written by `paraflow cluster up`.
host=
while [ $# -gt 0 ]; do
  case "$1" in
    -[BbcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -*) shift ;;
    *) if [ -z "$host" ]; then host=$1; shift; else break; fi ;;
  esac
done
host=${{host#*@}}
case "$host" in
{table}
  *) echo "ssh: Could not resolve hostname $host: not a host of the emulated cluster {cluster}" >&2; exit 255 ;;
esac
if [ $# -eq 0 ]; then
  echo "ssh: the emulated cluster runs commands only; use: paraflow cluster exec $name -- COMMAND" >&2
  exit 255
fi
exec ip netns exec "$ns" unshare --uts env -i HOME="${{HOME:-/root}}" USER="${{USER:-root}}" \\
  LOGNAME="${{LOGNAME:-root}}" SHELL=/bin/sh LANG="${{LANG:-C.UTF-8}}" PATH={path} \\
  sh -c 'hostname "$0" && exec sh -c "$1"' "$name" "$*"
"""


def write_ssh_agent(path: str, cluster: str, hosts: Sequence[tuple[str, str, str]]) -> str:
    """Write the stand-in to `path` (executable) for `hosts`: (host name, address, namespace) each."""
    table = "\n".join(
        f"  {shlex.quote(name)}|{shlex.quote(address)}) ns={shlex.quote(ns)} name={shlex.quote(name)} ;;"
        for name, address, ns in hosts
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(_TEMPLATE.format(cluster=cluster, table=table, path=shlex.quote(LOGIN_PATH)))
    os.chmod(path, 0o755)
    return path

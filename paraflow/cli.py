"""The `paraflow` command: list backends, compare them."""

from __future__ import annotations

import argparse
import sys


def _backends(args: argparse.Namespace) -> int:
    from .registry import available_backends
    for name, reason in available_backends().items():
        print(f"{name:10s} {'available' if reason is None else 'unavailable: ' + reason}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .compare import compare
    rows = compare(nproc=args.nproc, epochs=args.epochs)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="paraflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("backends", help="list registered backends and whether each can run here").set_defaults(
        func=_backends)
    bench = sub.add_parser("bench", help="train under every available backend and compare")
    bench.add_argument("--nproc", type=int, default=2, help="processes for multi-process backends")
    bench.add_argument("--epochs", type=int, default=3)
    bench.set_defaults(func=_bench)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

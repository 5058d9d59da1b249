"""Command line: ``python -m numbapool bench [--quick] [--threads N] [--cases NAME ...]``."""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"bench": "side-by-side timing against onnxruntime and torch"}
    if not argv or argv[0] not in commands:
        print("usage: python -m numbapool {" + ",".join(commands) + "} [options]")
        for name, what in commands.items():
            print(f"  {name:8s} {what}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    from . import _bench

    return _bench.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())

"""Command line: ``python -m numbapool {info,warmup,bench}`` (also the ``numbapool`` script)."""

from __future__ import annotations

import argparse
import json
import platform
import sys

# CPU features that decide how fast the kernels run: vector width and 16-bit float decoding.
_CPU_FEATURES = (
    "sse4.2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512fp16",
    "avx512bf16",
    "neon",
    "sve",
)


def info() -> dict:
    """What a bug report needs: versions, threads, cache and CPU features."""
    import llvmlite
    import numba
    import numpy as np
    from llvmlite import binding

    import numbapool

    from . import _cache, _threads

    numba.get_num_threads()  # starts numba's threads, so that the layer in force is known
    features = binding.get_host_cpu_features()
    return {
        "numbapool": numbapool.__version__,
        "numba": numba.__version__,
        "numpy": np.__version__,
        "llvmlite": llvmlite.__version__,
        "python": platform.python_version(),
        "parallel_calls": _threads.parallel_path(),
        "threading_layer": _threads.threading_layer(),
        "threading_layer_requested": numba.config.THREADING_LAYER,
        "threads": numbapool.get_num_threads(),
        "thread_limit": numba.config.NUMBA_NUM_THREADS,
        "cache_directory": _cache.CACHE_DIRECTORY,
        "cache_problem": _cache.CACHE_PROBLEM,
        "cached_kernels": _cache.cache_contents(),
        "cpu": binding.get_host_cpu_name(),
        "cpu_features": [name for name in _CPU_FEATURES if features.get(name, False)],
    }


def _print_info(as_json: bool) -> None:
    facts = info()
    if as_json:
        print(json.dumps(facts, indent=2))
        return
    cached = facts.pop("cached_kernels")
    facts["cpu_features"] = " ".join(facts["cpu_features"]) or "(none of interest)"
    width = max(map(len, [*facts, *(f"  {kernel}" for kernel in cached)]))
    for key, value in facts.items():
        print(f"{key:{width}s}  {value}")
    print("cached kernels:" if cached else "cached kernels: none")
    for kernel, entry in cached.items():
        print(f"  {kernel:{width - 2}s}  {entry['files']} files, {entry['bytes'] / 1e6:.1f} MB")


def main(argv=None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="numbapool", description="numbapool's commands: info, warmup, bench."
    )
    parser.add_argument("--version", action="version", version=f"numbapool {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{info,warmup,bench}")
    info_parser = commands.add_parser("info", help="versions, threads, cache, CPU features")
    info_parser.add_argument("--json", action="store_true", help="print JSON")
    warm = commands.add_parser("warmup", help="compile kernels now, with a progress bar")
    warm.add_argument("--ops", nargs="+", metavar="OP", help="ONNX operator names (default all)")
    warm.add_argument("--dtypes", nargs="+", metavar="DTYPE", help="dtype names (default all)")
    warm.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="worker processes compiling at once (default one per CPU, at most 8)",
    )
    warm.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="draw a progress bar (default: when stderr is a terminal)",
    )
    commands.add_parser(
        "bench",
        add_help=False,
        help="side-by-side timing against onnxruntime, torch, OpenVINO and JAX",
    )
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.command == "bench":
        from . import _bench

        return _bench.main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "info":
        _print_info(args.json)
        return 0
    if args.command == "warmup":
        import numbapool

        try:
            # the kernels into the disk cache only: this process exits next
            done = numbapool.warmup(
                args.ops, args.dtypes, progress=args.progress, processes=args.processes, load=False
            )
        except ValueError as error:
            parser.error(str(error))
        print(f"{len(done)} operator and dtype pairs ready")
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())

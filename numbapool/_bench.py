"""``python -m numbapool bench``: numbapool side by side with the installed peers.

Method, so that a ratio means something on a small, noisy machine:

* one thread count for everyone (numba threads = onnxruntime intra_op_num_threads = torch
  threads = OpenVINO INFERENCE_NUM_THREADS), and the process held to that many cores
  (pin_to_cores), since a thread count alone does not hold every engine to it: XLA has no
  flag for its CPU threads and sizes its pool by the cores it may use; onnxruntime without
  spinning, at the faster of its EXTENDED and ALL graph levels; OpenVINO in one stream at
  f32 precision; JAX with the input on the device beforehand and ``jax_enable_x64``;
* each peer runs the cases it expresses directly (the peers are the ``bench`` extra: any
  not installed is left out);
* engines run interleaved, in blocks of at least ``BLOCK_SECONDS`` each, round after round,
  each block after ``WARMUP_SECONDS`` of untimed calls of its engine; a time is the median
  over rounds, a ratio the median of the per-round ratios;
* the roofline is (bytes read + bytes written) / the bandwidth of a streaming copy with the
  same threads, timed in each round beside the engines (a block of its own): numbapool's
  ratio to it is the median of the per-round ratios, as for the peers, so that the copy and
  numbapool meet the same load on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numba
import numpy as np

from ._cases import CASES, CASES_BY_NAME, SCALING_CASES, Case, make_input, ready, run, runner
from ._kernels.prefetch import LINE_BYTES

BLOCK_SECONDS = 0.025
# Untimed calls that open each engine's block in the side-by-side table, so that no
# engine's time carries the engine before it: after the streaming copy a call reads its
# input from memory again (numbapool's global average over long channels took 2.3 times
# as long for 2 ms), and after torch's block its OpenMP threads spin on for about 10 ms,
# while a 2-thread call of another engine took 2.5 to 3 times as long.
WARMUP_SECONDS = 0.015


def _timed_block(function, warmup: float = 0.0) -> float:
    """Seconds per call, over a block of calls lasting at least BLOCK_SECONDS, after
    untimed calls lasting ``warmup`` seconds (at least one call where it is not 0)."""
    if warmup:
        end = time.perf_counter() + warmup
        while True:
            function()
            if time.perf_counter() >= end:
                break
    calls = 0
    start = time.perf_counter()
    while True:
        function()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= BLOCK_SECONDS:
            return elapsed / calls


@numba.njit(parallel=True, cache=True)
def _stream_copy(source, destination):
    for i in numba.prange(source.shape[0]):
        destination[i] = source[i]


def stream_copy():
    """(a call that copies 256 MiB in parallel, far past the caches; the bytes it reads and
    writes)."""
    source = np.ones(32 * 2**20, dtype=np.float64)
    destination = np.empty_like(source)
    _stream_copy(source, destination)
    return (lambda: _stream_copy(source, destination)), 2 * source.nbytes


# --------------------------------------------------------------------------- peers


def _onnx_model(case: Case, x: np.ndarray) -> bytes:
    """The case as a one-node ONNX model (opset 22), serialized."""
    import onnx
    from onnx import helper

    element = helper.np_dtype_to_tensor_dtype(x.dtype)
    outputs = ["y", "indices"] if case.return_indices else ["y"]
    node = helper.make_node(case.op, ["x"], outputs, **case.attrs)
    graph = helper.make_graph(
        [node],
        "bench",
        [helper.make_tensor_value_info("x", element, x.shape)],
        [
            helper.make_tensor_value_info(
                name, element if name == "y" else onnx.TensorProto.INT64, None
            )
            for name in outputs
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    return model.SerializeToString()


def _onnxruntime_runner(case: Case, x: np.ndarray, threads: int):
    import onnxruntime as ort

    model = _onnx_model(case, x)
    runners = []
    for level in (
        ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    ):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = level
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        feed = {"x": x}
        runners.append(lambda session=session, feed=feed: session.run(None, feed))
    for session_call in runners:
        session_call()
    return min(runners, key=lambda r: min(_timed_block(r) for _ in range(3)))


def _torch_sizes(sizes):
    """Sizes along each axis as torch's pooling functions take them quickest: one int
    where they are all the same, else a tuple."""
    return sizes[0] if len(set(sizes)) == 1 else tuple(sizes)


def _torch_runner(case: Case, x: np.ndarray, threads: int):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    # numbapool's own input, not a copy: the same pages. Whether a buffer's pages are huge
    # (transparent huge pages) is the kernel's luck, and it moved a global average's time
    # over 12.8 MB in the L3 by a tenth, in both engines. torch only reads it, and warns
    # that the array is read-only.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(x)
    rank = x.ndim - 2
    attrs = case.attrs
    if case.op == "GlobalAveragePool":
        axes = tuple(range(2, x.ndim))
        return lambda: tensor.mean(dim=axes, keepdim=True)
    if case.op == "GlobalMaxPool":
        axes = tuple(range(2, x.ndim))
        return lambda: tensor.amax(dim=axes, keepdim=True)
    kernel = attrs["kernel_shape"]
    strides = attrs.get("strides", [1] * rank)
    pads = attrs.get("pads", [0] * (2 * rank))
    if pads[:rank] != pads[rank:] or any(2 * p > k for p, k in zip(pads[:rank], kernel)):
        return None  # torch pads symmetrically, at most half the kernel
    if attrs.get("ceil_mode"):
        return None  # torch drops other windows than ONNX's at the end of an axis
    # each size as one int where every axis takes the same, and the operators' own
    # functions rather than F.max_poolNd's wrapper: torch's quickest call, as its users
    # write it (F.max_pool2d with a list for each argument took 1.7 times as long over the
    # tiny case, 4.7 us against 2.8)
    padding = _torch_sizes(pads[:rank])
    kernel, strides = _torch_sizes(kernel), _torch_sizes(strides)
    if case.op == "MaxPool":
        dilation = _torch_sizes(attrs.get("dilations", [1] * rank))
        if case.return_indices:
            function = getattr(F, f"max_pool{rank}d_with_indices")
        else:
            function = getattr(torch, f"max_pool{rank}d")
        return lambda: function(tensor, kernel, strides, padding, dilation)
    if case.op == "AveragePool":
        function = getattr(F, f"avg_pool{rank}d")
        include = bool(attrs.get("count_include_pad", 0))
        return lambda: function(tensor, kernel, strides, padding, False, include)
    return None  # LpPool: torch has no padding for it


def _openvino_runner(case: Case, x: np.ndarray, threads: int):
    import openvino as ov

    core = ov.Core()
    model = core.read_model(_onnx_model(case, x), b"")  # the same model onnxruntime runs
    # f32 inference: the CPU plugin's default precision on bf16-capable CPUs is bf16
    compiled = core.compile_model(
        model,
        "CPU",
        {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32"},
    )
    request = compiled.create_infer_request()
    feed = {0: x}
    return lambda: request.infer(feed, share_inputs=True)


def _jax_runner(case: Case, x: np.ndarray, threads: int):
    import os

    # XLA has no flag for its CPU threads: it sizes its pool by the cores the process may
    # use, which pin_to_cores sets. With a GPU build of jax the input would go to the GPU.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    from jax import lax

    jax.config.update("jax_enable_x64", True)  # float64 stays float64
    if case.return_indices or case.attrs.get("ceil_mode"):
        return None  # no Indices output; no ceil_mode
    rank = x.ndim - 2
    axes = tuple(range(2, x.ndim))
    attrs = case.attrs
    constants = ()  # arrays the timed function takes besides the input, on the device
    if case.op == "GlobalAveragePool":
        function = lambda a: jnp.mean(a, axis=axes, keepdims=True)
    elif case.op == "GlobalMaxPool":
        function = lambda a: jnp.max(a, axis=axes, keepdims=True)
    else:
        if "auto_pad" in attrs:
            return None
        window = (1, 1, *attrs["kernel_shape"])
        strides = (1, 1, *attrs.get("strides", [1] * rank))
        pads = attrs.get("pads", [0] * (2 * rank))
        padding = ((0, 0), (0, 0), *zip(pads[:rank], pads[rank:]))
        dilation = (1, 1, *attrs.get("dilations", [1] * rank))

        def window_sum(a):
            return lax.reduce_window(
                a,
                jnp.zeros((), a.dtype),
                lax.add,
                window,
                strides,
                padding,
                window_dilation=dilation,
            )

        if case.op == "MaxPool":
            lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
            function = lambda a: lax.reduce_window(
                a,
                jnp.array(lowest, a.dtype),
                lax.max,
                window,
                strides,
                padding,
                window_dilation=dilation,
            )
        elif case.op == "AveragePool":
            if attrs.get("count_include_pad", 0):
                count = np.prod(attrs["kernel_shape"])
                function = lambda a: window_sum(a) / count
            else:
                # the taps inside the input per output, counted once beforehand: inside the
                # timed function XLA would fold them into a constant while compiling it
                constants = (jax.jit(window_sum)(jnp.ones(x.shape, x.dtype)),)
                function = lambda a, counts: window_sum(a) / counts
        else:  # LpPool
            p = attrs.get("p", 2)
            function = lambda a: window_sum(jnp.abs(a) ** p) ** (1 / p)
    compiled = jax.jit(function)
    cpu = jax.devices("cpu")[0]
    on_device = jax.device_put(x, cpu)
    constants = tuple(jax.device_put(constant, cpu) for constant in constants)
    return lambda: compiled(on_device, *constants).block_until_ready()


PEERS = {
    "onnxruntime": _onnxruntime_runner,
    "torch": _torch_runner,
    "openvino": _openvino_runner,
    "jax": _jax_runner,
}


def _peer_runners(case: Case, x: np.ndarray, threads: int) -> dict:
    runners = {}
    for name, make in PEERS.items():
        try:
            runner = make(case, x, threads)
            if runner is not None:
                runner()
                runners[name] = runner
        except ImportError:
            continue
        except Exception as error:  # a peer that cannot run a case is reported, not fatal
            print(f"  ({name} cannot run {case.name}: {type(error).__name__}: {error})")
    return runners


# --------------------------------------------------------------------------- the table


def pin_to_cores(count: int, first=()) -> list | None:
    """Hold every thread of this process, and the threads it starts later, to ``count`` of
    the cores it may use, those in ``first`` before the rest; the cores, sorted, or None
    where the platform has no CPU affinity (then nothing is pinned)."""
    import os

    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    preferred = [core for core in first if core in allowed]
    cores = sorted((preferred + [core for core in allowed if core not in preferred])[:count])
    try:
        tasks = [int(task) for task in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: the calling thread, whose later threads inherit its cores
        tasks = [0]
    for task in tasks:
        try:
            os.sched_setaffinity(task, cores)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    return cores


def describe_cores(cores: list | None) -> str:
    """The header's words for pin_to_cores' answer."""
    if cores is None:
        return "cores: not pinned (this platform has no CPU affinity)"
    runs, start = [], cores[0]
    for previous, core in zip(cores, cores[1:] + [None]):
        if core != previous + 1:
            runs.append(str(start) if start == previous else f"{start}-{previous}")
            start = core
    return f"cores: {','.join(runs)}"


def line_offset(x: np.ndarray) -> int:
    """How many bytes past a 64-byte boundary (a cache line's start) ``x`` starts."""
    return x.ctypes.data % LINE_BYTES


def placed_input(x: np.ndarray, offset: int) -> np.ndarray:
    """A copy of ``x`` that starts ``offset`` bytes past a 64-byte boundary.

    Where an input starts in its cache lines moves a global average's time over 12.8 MB
    on one core by a tenth, and the other way for torch (docs/performance.md); NumPy's
    allocator puts a large new array 16 bytes past a line, one made from freed memory at
    any multiple of 16."""
    storage = np.empty(x.nbytes + LINE_BYTES, np.uint8)
    start = (offset - storage.ctypes.data) % LINE_BYTES
    placed = storage[start : start + x.nbytes].view(x.dtype).reshape(x.shape)
    placed[...] = x
    return placed


def measure(case: Case, threads: int, rounds: int, copy, offset: int | None = None) -> dict:
    """A table row (summarize) for ``case``; ``copy`` is stream_copy(); the input placed
    ``offset`` bytes past a cache line's start (placed_input), or where NumPy puts it."""
    x = make_input(case.shape, case.dtype, case.data)
    if offset is not None:
        x = placed_input(x, offset)
    outputs = run(case, x)  # compiles, and gives the bytes written
    bytes_moved = x.nbytes + sum(o.nbytes for o in outputs)
    copy_call, copy_bytes = copy
    engines = {"numbapool": runner(case, x), **_peer_runners(case, x, threads), "copy": copy_call}
    times = {name: [] for name in engines}
    order = list(engines)
    for r in range(rounds):
        for name in order[r % len(order) :] + order[: r % len(order)]:  # rotate who goes first
            times[name].append(_timed_block(engines[name], WARMUP_SECONDS))
    row = summarize(case.name, times, bytes_moved, copy_bytes)
    row["offset"] = line_offset(x)
    return row


def summarize(case_name: str, times: dict, bytes_moved: int, copy_bytes: int) -> dict:
    """A table row from per-round times in seconds (``times["numbapool"]``, one list per
    peer and ``times["copy"]``, the streaming copy of ``copy_bytes``, round i of each
    measured side by side): medians in ms, and numbapool's ratios to each peer and to the
    roofline (``bytes_moved`` at the round's copy speed) as the medians of the per-round
    ratios, so that a noisy round slows both sides of a ratio."""
    times = dict(times)
    copies = times.pop("copy")
    row = {
        "case": case_name,
        "bytes": bytes_moved,
        "copy GB/s": statistics.median(copy_bytes / t for t in copies) / 1e9,
    }
    for name, samples in times.items():
        row[f"{name} ms"] = 1e3 * statistics.median(samples)
    peers = [name for name in times if name != "numbapool"]
    ratios = {
        name: statistics.median(a / b for a, b in zip(times["numbapool"], times[name]))
        for name in peers
    }
    # the best peer is the fastest one: the largest numbapool / peer ratio
    row["vs best peer"] = max(ratios.values()) if ratios else None
    row["best peer"] = max(ratios, key=ratios.get) if ratios else None
    row["vs roofline"] = statistics.median(
        t * copy_bytes / (c * bytes_moved) for t, c in zip(times["numbapool"], copies)
    )
    return row


def format_table(rows: list, threads: int, cores: str = "") -> str:
    """One column per engine in PEERS (n/a where it is not installed or cannot run the
    case); the ratio is to the fastest peer of each row; the copy's speed in that row's
    rounds, which its roofline ratio is to; the bytes from a cache line's start to the
    input's (measure's ``offset``). ``cores`` is describe_cores' text."""

    def cell(value, digits=3):
        return "n/a" if value is None else f"{value:.{digits}f}"

    engines = ["numbapool", *PEERS]
    speeds = [row["copy GB/s"] for row in rows]
    lines = [
        f"threads: {threads}; {cores + '; ' if cores else ''}streaming copy: "
        f"{min(speeds):.1f} to {max(speeds):.1f} GB/s (the rows' medians)",
        "",
        "| case | "
        + " | ".join(f"{name} ms" for name in engines)
        + " | best peer | numbapool / best peer | copy GB/s | numbapool / roofline"
        + " | input's offset in its line |",
        "| --- |" + " ---: |" * len(engines) + " --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        offset = row.get("offset")
        lines.append(
            f"| {row['case']} | "
            + " | ".join(cell(row.get(f"{name} ms")) for name in engines)
            + f" | {row['best peer'] or 'n/a'} | {cell(row['vs best peer'], 2)} "
            f"| {cell(row['copy GB/s'], 1)} | {cell(row['vs roofline'], 2)} "
            f"| {'n/a' if offset is None else offset} |"
        )
    return "\n".join(lines)


def plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [row["case"] for row in rows]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    positions = np.arange(len(rows))
    ax.bar(
        positions - 0.2,
        [row["vs best peer"] or np.nan for row in rows],
        0.4,
        label="numbapool / best peer",
    )
    ax.bar(positions + 0.2, [row["vs roofline"] for row in rows], 0.4, label="numbapool / roofline")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(positions, names, rotation=45, ha="right")
    ax.set_ylabel("time ratio (lower is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


@numba.njit(parallel=True, cache=True)
def _square_roots(values, out):
    for row in numba.prange(values.shape[0]):
        for i in range(values.shape[1]):
            out[row, i] = np.sqrt(values[row, i])


@numba.njit(parallel=True, cache=True)
def _products_and_sums(values, out):
    for row in numba.prange(values.shape[0]):
        for i in range(values.shape[1]):
            value = values[row, i]
            for _ in range(8):  # a chain: each step waits on the one before
                value = value * 1.0000001 + 1e-9
            out[row, i] = value


def arithmetic_calls() -> list:
    """[(name, element count, call)]: the machine's float64 arithmetic alone, no pooling,
    over 2 MiB of values the caches hold, its rows dealt out to the threads: the speedup
    that arithmetic gets from the threads at the moment, beside the pools'. On a shared
    machine a second thread's share varies: where it is low, compute-bound pools speed up
    as little."""
    values = np.random.default_rng(0).random((64, 4096)) + 1.0
    out = np.empty_like(values)
    return [
        (name, values.size, lambda kernel=kernel: kernel(values, out))
        for name, kernel in (
            ("float64 square roots (no pooling)", _square_roots),
            ("8 chained products and sums (no pooling)", _products_and_sums),
        )
    ]


def _timed_at_counts(call, counts: list, rounds: int) -> dict:
    """{count: [...]}: seconds per call of ``call`` at each numba thread count in
    ``counts``, a block of each per round, their order turning round by round; numba's
    count is left at the last of ``counts``."""
    times = {count: [] for count in counts}
    for r in range(rounds):
        for count in counts[r % len(counts) :] + counts[: r % len(counts)]:
            numba.set_num_threads(count)
            times[count].append(_timed_block(call))
    numba.set_num_threads(counts[-1])
    return times


def thread_ladder(threads: int) -> list:
    """1, 2, 4, ... up to ``threads``, and ``threads`` itself."""
    counts = [1]
    while counts[-1] * 2 < threads:
        counts.append(counts[-1] * 2)
    return counts + [threads] if threads > 1 else counts


def scaling(threads: int, rounds: int, cores: str = "", cases=SCALING_CASES) -> str:
    """numbapool alone at 1, 2, 4, ... and ``threads`` threads (thread_ladder), interleaved:
    time per call at each count, the speedup at ``threads`` (median of per-round ratios) and
    time per million input elements; then the same for plain arithmetic
    (arithmetic_calls)."""
    counts = thread_ladder(threads)
    lines = [
        f"threads: {', '.join(map(str, counts))}{'; ' + cores if cores else ''}",
        "",
        "| case | input elements | "
        + " | ".join(f"{c} thread{'s' if c > 1 else ''} ms" for c in counts)
        + f" | speedup at {threads} | {threads} threads ms per million elements |",
        "| --- | ---: |" + " ---: |" * len(counts) + " ---: | ---: |",
    ]
    calls = []
    for case in cases:
        x = make_input(case.shape, case.dtype, case.data)
        call = runner(case, x)
        ready(call)
        calls.append((case.name, x.size, call))
    for name, size, call in calls + arithmetic_calls():
        call()
        times = _timed_at_counts(call, counts, rounds)
        speedup = statistics.median(a / b for a, b in zip(times[1], times[threads]))
        medians = [1e3 * statistics.median(times[c]) for c in counts]
        lines.append(
            f"| {name} | {size} | "
            + " | ".join(f"{m:.3f}" for m in medians)
            + f" | {speedup:.2f} | {medians[-1] / (size / 1e6):.3f} |"
        )
    return "\n".join(lines)


def start_busy(cores: list) -> list:
    """One process per core in ``cores`` that spins on it (pinned where the platform
    allows), as another program would: stop them with stop_busy."""
    import subprocess
    import sys

    script = (
        "import os, sys\n"
        "if hasattr(os, 'sched_setaffinity'):\n"
        "    os.sched_setaffinity(0, {int(sys.argv[1])})\n"
        "while True:\n"
        "    pass\n"
    )
    return [subprocess.Popen([sys.executable, "-c", script, str(core)]) for core in cores]


def stop_busy(processes: list) -> None:
    for process in processes:
        process.kill()
    for process in processes:
        process.wait()


def under_load(threads: int, busy_cores: list, rounds: int, cases=CASES, cores: str = "") -> str:
    """Each case's numbapool call at ``threads`` threads and at 1 thread, interleaved round
    by round, on a quiet machine and with a busy process spinning on each core of
    ``busy_cores``: times per call (medians) and the ratio N threads / 1 thread (the median
    of the per-round ratios)."""
    from . import _threads

    lines = [
        "",
        "",
        f"| case | quiet {threads} threads ms | quiet 1 thread ms "
        f"| quiet {threads} / 1 | busy {threads} threads ms | busy 1 thread ms "
        f"| busy {threads} / 1 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for case in cases:
        x = make_input(case.shape, case.dtype, case.data)
        call = runner(case, x)
        ready(call)
        cells = []
        for busy in (False, True):
            processes = start_busy(busy_cores) if busy else []
            try:
                times = _timed_at_counts(call, [1, threads], rounds)
            finally:
                stop_busy(processes)
            ratio = statistics.median(a / b for a, b in zip(times[threads], times[1]))
            cells += [
                f"{1e3 * statistics.median(times[threads]):.3f}",
                f"{1e3 * statistics.median(times[1]):.3f}",
                f"{ratio:.2f}",
            ]
        lines.append(f"| {case.name} | " + " | ".join(cells) + " |")
        print(f"  {case.name}: done", flush=True)
    lines[0] = (
        f"threads: {threads}; {cores + '; ' if cores else ''}parallel calls: "
        f"{_threads.parallel_path()}; busy: one spinning process on each of cores "
        f"{', '.join(map(str, busy_cores))}"
    )
    return "\n".join(lines)


# First calls timed in fresh processes: each operator (and each kind of MaxPool kernel) on
# an input large enough for the parallel kernels, as a user's first call usually is.
FIRST_CALL_INPUT = "np.random.default_rng(0).standard_normal((2, 16, 96, 96)).astype(np.float32)"
FIRST_CALLS = {
    "MaxPool 3x3 s2 pads 1": "numbapool.max_pool(x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1])",
    "MaxPool 2x2 s2": "numbapool.max_pool(x, [2, 2], strides=[2, 2])",
    "MaxPool 3x3 float16": "numbapool.max_pool(x.astype(np.float16), [3, 3], strides=[2, 2])",
    "MaxPool 3x3 uint8": "numbapool.max_pool((x * 40).astype(np.uint8), [3, 3])",
    "MaxPool 3x3x3 (3-D)": "numbapool.max_pool(x.reshape(2, 16, 16, 24, 24), [3, 3, 3], "
    "strides=[2, 2, 2])",
    "MaxPool with Indices": "numbapool.max_pool(x, [3, 3], strides=[2, 2], return_indices=True)",
    "AveragePool 3x3": "numbapool.average_pool(x, [3, 3], pads=[1, 1, 1, 1])",
    "AveragePool 5x5": "numbapool.average_pool(x, [5, 5], pads=[2, 2, 2, 2])",
    "AveragePool 2x2 s2 float64": "numbapool.average_pool(x.astype(np.float64), [2, 2], "
    "strides=[2, 2])",
    "LpPool p=3": "numbapool.lp_pool(x, [3, 3], p=3)",
    "LpPool 2x2 s2 p=3": "numbapool.lp_pool(x, [2, 2], strides=[2, 2], p=3)",
    "GlobalMaxPool": "numbapool.global_max_pool(x)",
    "GlobalAveragePool": "numbapool.global_average_pool(x)",
    "GlobalLpPool": "numbapool.global_lp_pool(x)",
    "MaxUnpool": "numbapool.max_unpool(x, np.arange(x.size).reshape(x.shape), [2, 2], "
    "strides=[2, 2])",
}


def _fresh_process(cache_dir: str, script: str) -> str:
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"a fresh process failed:\n{result.stderr[-2000:]}")
    return result.stdout


def _cache_megabytes(cache_dir: str) -> float:
    import os

    return (
        sum(
            os.path.getsize(os.path.join(d, name))
            for d, _, names in os.walk(cache_dir)
            for name in names
        )
        / 1e6
    )


def first_call(calls=None, warmup: bool = True) -> str:
    """Per operator, in fresh processes on a cache of its own: seconds to import numbapool
    and for the first call, with the cache empty (compiling) and then warm, and the cache's
    size after each; then ``numbapool.warmup`` of every operator in float32 (every kind of
    kernel the dispatcher chooses, in one dtype), likewise."""
    import tempfile

    script = (
        "import time; t = time.perf_counter(); import numpy as np, numbapool; "
        f"i = time.perf_counter() - t; x = {FIRST_CALL_INPUT}; t = time.perf_counter(); "
        "{call}; print(i, time.perf_counter() - t)"
    )
    lines = [
        "| first call, fresh process | import s (empty / warm) | first call s, empty cache "
        "| cache MB | first call s, warm cache | cache MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in calls or FIRST_CALLS:
        with tempfile.TemporaryDirectory() as cache_dir:
            runs = []
            for _ in range(2):
                out = _fresh_process(cache_dir, script.format(call=FIRST_CALLS[name]))
                runs.append([float(v) for v in out.split()[-2:]] + [_cache_megabytes(cache_dir)])
        (cold_import, cold, cold_mb), (warm_import, warm, warm_mb) = runs
        lines.append(
            f"| {name} | {cold_import:.2f} / {warm_import:.2f} | {cold:.2f} "
            f"| {cold_mb:.1f} | {warm:.3f} | {warm_mb:.1f} |"
        )
        print(f"  first call {name}: done", flush=True)
    if warmup:
        script = (
            "import time; t = time.perf_counter(); import numbapool; "
            "numbapool.warmup(dtypes=['float32'], progress=False); "
            "print(time.perf_counter() - t)"
        )
        with tempfile.TemporaryDirectory() as cache_dir:
            runs = []
            for _ in range(2):
                runs.append(
                    (
                        float(_fresh_process(cache_dir, script).split()[-1]),
                        _cache_megabytes(cache_dir),
                    )
                )
        lines.append(
            f"| warmup, every operator in float32 (import included) | | {runs[0][0]:.1f} "
            f"| {runs[0][1]:.1f} | {runs[1][0]:.2f} | {runs[1][1]:.1f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m numbapool bench", description=__doc__.split("\n\n")[0].replace("``", "")
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds (5 instead of 25)")
    parser.add_argument(
        "--rounds", type=int, metavar="N", help="this many rounds (default 25, or 5 with --quick)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=numba.config.NUMBA_NUM_THREADS,
        help="threads for numbapool and every peer, the process held to "
        "that many cores (default NUMBA_NUM_THREADS)",
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        metavar="NAME",
        help="only these cases: " + ", ".join(repr(c.name) for c in CASES),
    )
    parser.add_argument(
        "--offset",
        type=int,
        metavar="BYTES",
        help="start each input this many bytes past a 64-byte boundary, 0 to 63 and a "
        "multiple of its item size (default: where NumPy's allocator puts it)",
    )
    parser.add_argument("--plot", metavar="PNG", help="also draw the ratios into this file")
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="instead: numbapool at 1, 2, 4, ... and N threads, over sizes "
        "(or the cases named), beside plain arithmetic",
    )
    parser.add_argument(
        "--first-call",
        action="store_true",
        help="instead: each operator's first call in fresh processes, on an "
        "empty and a warm cache, and warmup of float32",
    )
    parser.add_argument(
        "--busy",
        nargs="+",
        type=int,
        metavar="CORE",
        help="instead: each case at N threads and at 1 thread, quiet and "
        "with a process spinning on each CORE named (0-based)",
    )
    parser.add_argument(
        "--dask",
        action="store_true",
        help="instead: numbapool.dask on a local cluster, an input several "
        "times the workers' memory, and the overhead on one that fits",
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 25)
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds: need at least 1 round, got {args.rounds}")
    if not 1 <= args.threads <= numba.config.NUMBA_NUM_THREADS:
        parser.error(
            f"--threads: between 1 and {numba.config.NUMBA_NUM_THREADS} "
            f"(NUMBA_NUM_THREADS), got {args.threads}"
        )
    if args.dask:
        from ._bench_dask import dask_report

        print(dask_report())
        return 0
    if args.first_call:
        print(first_call())
        return 0
    cases = CASES
    if args.cases:
        unknown = [name for name in args.cases if name not in CASES_BY_NAME]
        if unknown:
            parser.error(f"unknown case {unknown[0]!r}; known: {', '.join(CASES_BY_NAME)}")
        cases = [CASES_BY_NAME[name] for name in args.cases]
    if args.offset is not None:
        if not 0 <= args.offset < LINE_BYTES:
            parser.error(f"--offset: between 0 and {LINE_BYTES - 1} bytes, got {args.offset}")
        for case in cases:
            size = np.dtype(case.dtype).itemsize
            if args.offset % size:
                parser.error(
                    f"--offset: {args.offset} is not a multiple of {case.dtype}'s {size} bytes "
                    f"(case {case.name!r}); name the cases that take it with --cases"
                )
    if args.busy:
        import os

        allowed = (
            os.sched_getaffinity(0)
            if hasattr(os, "sched_getaffinity")
            else range(os.cpu_count() or 1)
        )
        outside = [core for core in args.busy if core not in allowed]
        if outside:
            parser.error(
                f"--busy: core {outside[0]} is not one this process may use "
                f"({', '.join(map(str, sorted(allowed)))})"
            )
    # every measurement below runs in this process, held to as many cores as threads (the
    # busy cores among them)
    cores = describe_cores(pin_to_cores(args.threads, first=args.busy or ()))
    numba.set_num_threads(args.threads)
    if args.scaling:
        print(scaling(args.threads, rounds, cores, cases if args.cases else SCALING_CASES))
        return 0
    if args.busy:
        print(under_load(args.threads, args.busy, rounds, cases, cores))
        return 0
    copy = stream_copy()
    rows = []
    for case in cases:
        rows.append(measure(case, args.threads, rounds, copy, args.offset))
        print(f"  {case.name}: done", flush=True)
    print(format_table(rows, args.threads, cores))
    if args.plot:
        plot(rows, args.plot)
    return 0

"""A cache hint for loops whose memory access the hardware prefetchers follow too late."""

from pathlib import Path

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from . import INLINED

_I32 = ir.IntType(32)
# How far ahead of its reads a loop asks for memory, and a cache line
AHEAD_BYTES = 4096
LINE_BYTES = 64


@intrinsic
def prefetch(typingctx, array, index):
    """Ask the CPU to bring the cache line of ``array[index]`` into its nearest cache for a
    read (LLVM's ``llvm.prefetch``). Only a hint: it changes no value and never faults, so
    ``index`` may lie past the end of ``array``."""
    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        address = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
        hint = builder.module.declare_intrinsic(
            "llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [address.type, _I32, _I32, _I32])
        )
        # read (0), keep in all cache levels (3), data cache (1)
        builder.call(
            hint, [address, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)]
        )
        return context.get_dummy_value()

    return types.void(array, index), codegen


def prefetch_range(flat, start, count):
    """Ask for the cache lines of flat[start:start + count]."""


# Compiled once per dtype for LLVM to inline, not inlined in numba's IR at each call site:
# the columns kernel's first call took 0.2 to 0.4 s less (fresh processes in turn)
@overload(prefetch_range, jit_options=INLINED)
def _prefetch_range_overload(flat, start, count):
    # in elements of this dtype, as a constant: an array's itemsize is read at run time
    line = np.uint64(LINE_BYTES * 8 // flat.dtype.bitwidth)

    def impl(flat, start, count):
        offset = np.uint64(0)
        while offset < count:  # not a range with a step: that divides for its count
            prefetch(flat, start + offset)
            offset += line

    return impl


def prefetch_ahead(flat, start, count):
    """Ask for the cache lines of flat[start:start + count] shifted AHEAD_BYTES on: the
    data a loop over short stretches (say, channels of 7x7) reaches next, which the
    hardware prefetchers, tuned to long streams, bring too late."""


@overload(prefetch_ahead, jit_options=INLINED)
def _prefetch_ahead_overload(flat, start, count):
    ahead = np.uint64(AHEAD_BYTES * 8 // flat.dtype.bitwidth)

    def impl(flat, start, count):
        prefetch_range(flat, start + ahead, count)

    return impl


# Inputs from this size on are read with prefetch_ahead by the columns kernel (MaxPool),
# the fixed windows' sums and MaxPool with Indices' row kernel. The columns kernel asks
# for the rows an output row steps over: MaxPool 3x3 s2 with pads over 9.6 MB of float64
# took 0.84 of the time with it; smaller inputs, which the caches hold, gained nothing.
PREFETCH_INPUT_BYTES = 8 << 20


def _last_level_cache_bytes() -> int | None:
    """The largest cache the first CPU reports (Linux's sysfs), in bytes, or None."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            continue
    return max(sizes) if sizes else None


# A thread's share of an input from which its short loops ask for memory ahead: a quarter
# of the last-level cache (8 MiB where none is reported, a 32 MiB L3)
SHARE_AHEAD_BYTES = (_last_level_cache_bytes() or 32 << 20) // 4


def reads_ahead(input_bytes: int, threads: int) -> bool:
    """Whether each of ``threads`` threads reads so much of an input of ``input_bytes``
    that loops over short stretches of it should ask for memory ahead (global_.
    global_max_units, block_sum_units): a share of SHARE_AHEAD_BYTES or more. One core's
    loads over short channels then wait on memory; over less, the caches hold what it
    reads, and asking only costs. GlobalMaxPool over 7x7 channels on a 32 MiB L3, with
    against without: on one core 12.8 MB 0.59 to 0.61 of the time, 9.6 MB 0.82, but
    6.4 MB 1.16x and 3.2 MB 1.19x as long; at 2 threads 12.8 MB 1.00, 9.6 MB 1.15x as
    long."""
    return input_bytes >= threads * SHARE_AHEAD_BYTES


# AheadChoice's trials: blocks of AHEAD_BLOCK_RUNS runs of one way each, in this order
# (plain, ahead, ahead, plain), so that the first calls of a process, slower than the
# later ones, weigh on both ways alike; the first run of a block, which follows the other
# way's (or the compile), is not counted
AHEAD_BLOCKS = (False, True, True, False)
AHEAD_BLOCK_RUNS = 3
AHEAD_TRIAL_RUNS = len(AHEAD_BLOCKS) * AHEAD_BLOCK_RUNS
# The trials start once a call shape's runs, plain until then, add up to this many seconds.
# A shape's first runs are slower, and unevenly (pages faulted in, caches warming, another
# library's threads spinning on after its own calls): in the bench's first blocks the
# plain trial runs over 12.8 MB took 0.4 to 1.2 ms against 0.15 steady, and the runs of
# the blocks reading ahead, still warming, 0.18 to 0.7; GlobalAveragePool over 7x7
# channels chose to read ahead in a run on a loaded machine, which on this Zen 4 takes
# 1.3x as long.
AHEAD_WARMUP_SECONDS = 0.02


class AheadChoice:
    """Whether a global pool's calls of one shape and thread count read ahead, where their
    shares are large enough for it to matter (reads_ahead): chosen by the time each way
    took on this machine in its first calls after a warm-up (AHEAD_WARMUP_SECONDS), in
    blocks of each way (AHEAD_BLOCKS).

    Whether asking for memory ahead pays depends on the processor's own prefetchers.
    GlobalMaxPool over 7x7 channels on one core, 12.8 MB: on a Zen 3 reading ahead took
    0.59 to 0.61 of the time; on a Zen 4 1.3x as long, and longer at every size from 3.2
    to 51 MB. Calls alternating one by one did not show it: there each way took the
    other's time (0.19 to 0.28 ms both), and one process in three chose to read ahead. The
    way with the fastest counted run stays: what else runs on the machine only ever adds
    time, so the fastest run is the nearest to a way's own cost (by the lower median, a
    process here chose to read ahead from plain runs of 0.404, 0.316 and 0.258 ms against
    0.319, 0.315 and 0.314). The results are the same either way, bit for bit."""

    __slots__ = ("runs", "chosen", "trial", "warmed")

    def __init__(self) -> None:
        self.runs = ([], [])  # seconds of the counted runs without and with reading ahead
        self.chosen: bool | None = None
        self.trial = 0  # the trials' runs recorded so far
        self.warmed = 0.0  # seconds of the plain runs before the trials

    def now(self) -> bool:
        """Whether the next run reads ahead: the way chosen, else plain while warming up,
        else the way of the trials' block."""
        if self.chosen is not None:
            return self.chosen
        if self.warmed < AHEAD_WARMUP_SECONDS:
            return False
        return AHEAD_BLOCKS[self.trial // AHEAD_BLOCK_RUNS]

    def record(self, ahead: bool, seconds: float) -> None:
        """Take a run's time, with or without reading ahead; choose after the trials. A run
        of the other way than the block's (a call on another thread that began before the
        block did) is not taken."""
        if self.chosen is not None:
            return
        if self.warmed < AHEAD_WARMUP_SECONDS:
            if not ahead:
                self.warmed += seconds
            return
        block, place = divmod(self.trial, AHEAD_BLOCK_RUNS)
        if AHEAD_BLOCKS[block] != ahead:
            return
        self.trial += 1
        if place:
            self.runs[ahead].append(seconds)
        if self.trial == AHEAD_TRIAL_RUNS:
            self.chosen = min(self.runs[True]) < min(self.runs[False])

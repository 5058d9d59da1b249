"""Kernels compile only the branches their literal kinds take (_numba.LiteralKindsCompiler):
what a kind never runs is never typed nor compiled, and what it runs gives the same
results (the differential tests check every kind's values against the reference)."""

import collections
import json
import os
import subprocess
import sys

from numba import njit, types
from numba.core import ir
from numba.core.compiler import Compiler

from numbapool._numba import LiteralKindsCompiler


def _by_kind(pipeline_class):
    """(a function of (x, kind) compiled with this pipeline, the callee of kind 0's branch,
    the callee of the others')."""

    @njit
    def plus_one(x):
        return x + 1

    @njit
    def twice(x):
        return x * 2

    @njit(inline="always")  # the branch inside an inlined function, as in the kernels
    def by_kind(x, kind):
        if kind == 0:
            return plus_one(x)
        return twice(x)

    @njit(pipeline_class=pipeline_class)
    def outer(x, kind, flag):
        if flag:
            x = x - 1
        return by_kind(x, kind)

    return outer, plus_one, twice


def _compiled_for(function, *argument_types):
    function.compile(argument_types)
    return function.overloads[argument_types].entry_point


def test_a_branch_a_literal_kind_never_takes_is_never_compiled():
    outer, plus_one, twice = _by_kind(LiteralKindsCompiler)
    kind_zero = _compiled_for(outer, types.int64, types.literal(0), types.literal(False))
    assert (len(plus_one.overloads), len(twice.overloads)) == (1, 0)
    assert kind_zero(5, 0, False) == 6
    kind_one = _compiled_for(outer, types.int64, types.literal(1), types.literal(True))
    assert (len(plus_one.overloads), len(twice.overloads)) == (1, 1)
    assert kind_one(5, 1, True) == 8


def test_numba_alone_compiles_every_branch():
    # what the pipeline changes: numba's own compiles the branch the kind never takes
    outer, plus_one, twice = _by_kind(Compiler)
    _compiled_for(outer, types.int64, types.literal(0), types.literal(False))
    assert (len(plus_one.overloads), len(twice.overloads)) == (1, 1)


def test_non_literal_arguments_keep_every_branch():
    outer, plus_one, twice = _by_kind(LiteralKindsCompiler)
    run = _compiled_for(outer, types.int64, types.int64, types.boolean)
    assert (len(plus_one.overloads), len(twice.overloads)) == (1, 1)
    assert (run(5, 0, False), run(5, 1, False), run(5, 0, True)) == (6, 10, 5)


def test_a_branch_a_literal_kind_never_takes_is_pruned_before_inlining(monkeypatch):
    # numba inlines the callees of every branch still there, before its later pruning:
    # the kernels' first calls spent that time on the branches of the other kinds
    from numba.core import inline_closurecall

    inlined = []
    inline = inline_closurecall.InlineWorker.inline_function

    def recording(self, caller_ir, block, i, function, *rest):
        inlined.append(function.__name__)
        return inline(self, caller_ir, block, i, function, *rest)

    monkeypatch.setattr(inline_closurecall.InlineWorker, "inline_function", recording)

    @njit(inline="always")
    def plus_one(x):
        return x + 1

    @njit(inline="always")
    def twice(x):
        return x * 2

    @njit(pipeline_class=LiteralKindsCompiler)
    def by_kind(x, kind, flag):
        if kind == 0 and flag:
            return plus_one(x)
        return twice(x)

    taken = _compiled_for(by_kind, types.int64, types.literal(0), types.literal(True))
    assert (taken(5, 0, True), inlined) == (6, ["plus_one"])
    other = _compiled_for(by_kind, types.int64, types.literal(0), types.literal(False))
    assert (other(5, 0, False), inlined) == (10, ["plus_one", "twice"])


def test_an_inlined_function_is_made_into_ir_once(monkeypatch):
    # numba's inliner makes a helper's untyped IR again at every call site of every
    # compile; the pipeline makes it once, and each site still gets its own copy
    from numba.core import inline_closurecall

    made = []
    make = inline_closurecall.InlineWorker.run_untyped_passes

    def recording(self, function, *rest):
        made.append(function.__name__)
        return make(self, function, *rest)

    monkeypatch.setattr(inline_closurecall.InlineWorker, "run_untyped_passes", recording)

    @njit(inline="always")
    def scaled(x, factor):
        total = x
        for _ in range(factor - 1):
            total = total + x
        return total

    @njit(pipeline_class=LiteralKindsCompiler)
    def two_sites(x):
        return scaled(x, 2) + scaled(x, 3)

    assert two_sites(1.5) == 7.5
    assert two_sites(4) == 20  # a second compile, for int64
    assert made == ["scaled"]


def _variable_copies(pipeline_class, monkeypatch) -> collections.Counter:
    """How many times each variable's IR was deep-copied compiling a function that inlines
    one helper (a loop and a branch: several blocks) at two call sites."""
    copies = collections.Counter()
    deepcopy = ir.Var.__deepcopy__

    def counting(self, memo):
        copies[self.name] += 1
        return deepcopy(self, memo)

    monkeypatch.setattr(ir.Var, "__deepcopy__", counting)

    @njit(inline="always")
    def clipped_sum(x, n):
        total = x
        for _ in range(n):
            if total > 10:
                total = total - 1
            else:
                total = total + x
        return total

    @njit(pipeline_class=pipeline_class)
    def two_sites(x):
        return clipped_sum(x, 2) + clipped_sum(x, 3)

    assert two_sites(1.5) == 4.5 + 6.0
    return copies


def test_each_call_site_copies_an_inlined_function_once(monkeypatch):
    # numba's inliner copies the IR it inlines twice, and each block's copy copies every
    # variable of the function again; the pipeline copies each variable once per site
    copies = _variable_copies(LiteralKindsCompiler, monkeypatch)
    assert copies["total"] == 2 and max(copies.values()) == 2
    assert _variable_copies(Compiler, monkeypatch)["total"] > 2  # numba alone


_COMPILES_PER_OPERATOR = """
import collections, json
import numpy as np
from numba.core import event
import numbapool

compiled = collections.Counter()


class Record(event.Listener):
    def on_start(self, compilation):
        compiled[compilation.data["dispatcher"].py_func.__qualname__] += 1

    def on_end(self, compilation):
        pass


event.register("numba:compile", Record())
x = np.ones((1, 2, 8, 8), np.float32)
firsts = []
# a 3x3 window at stride 3 along the first axis: the generic kernel, not the planes' one;
# a 4-wide one at step 3 along the rows: the generic kernel, not the wide windows' one
for call in (lambda: numbapool.average_pool(x, [3, 3], strides=[3, 1], pads=[1, 1, 1, 1]),
             lambda: numbapool.average_pool(x, [3, 4], strides=[1, 3]),
             lambda: numbapool.lp_pool(x, [3, 3], p=3)):
    call()
    firsts.append(dict(compiled))
    compiled.clear()
print(json.dumps(firsts))
"""


def test_the_summing_kernel_compiles_one_kind_of_p(tmp_path):
    # In a fresh process on an empty cache: AveragePool's first call compiles none of
    # LpPool's roots, and LpPool's none of AveragePool's three-tap rows; a window 3 taps
    # wide compiles the three-tap rows and not the generic ones (nor their loop per kind of
    # p, _kind_run), a 4-wide one the reverse
    process = subprocess.run(
        [sys.executable, "-c", _COMPILES_PER_OPERATOR],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)},
    )
    assert process.returncode == 0, process.stderr
    three_wide, four_wide, lp = json.loads(process.stdout.splitlines()[-1])
    assert three_wide["sum_pool_units"] == 1 and three_wide["three_tap_row_sums"] == 1
    assert not {"sum_over_last_axis", "_kind_run"} & set(three_wide)
    assert four_wide["sum_pool_units"] == 1 and four_wide["sum_over_last_axis"] == 1
    assert four_wide["_kind_run"] == 1 and "three_tap_row_sums" not in four_wide
    assert lp["sum_pool_units"] == 1
    assert lp["_kind_run"] == 1 and "three_tap_row_sums" not in lp

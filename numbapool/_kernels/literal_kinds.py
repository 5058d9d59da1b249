"""A compiler pipeline that compiles only the branches a kernel's literal kinds take, and
builds each inlined helper's IR once per process.

numba types and lowers every branch of a function, even one whose condition compares a
literal argument with a constant (``if p_kind == 0:`` compiled for ``Literal[int](2)``):
its dead-branch pruning resolves arguments only against None. Every callee in a branch a
kind never takes was typed and compiled all the same, a large part of a first call. This
pipeline turns each literal integer or boolean argument into a constant before numba's
pruning runs, so that its pruning (before and after inlining) drops those branches.

numba's inlining of an ``inline="always"`` function runs its untyped passes (bytecode to
IR, and the inlining of the helpers it calls in turn) at every call site, in every
compile. That IR depends on the function and the compile's flags alone, so this pipeline
keeps it, per function and flags, for the process's later call sites, and hands each site
a copy of its own. numba's inliner (InlineWorker.inline_ir) copies the IR it is given
twice, block by block, one copy to change and one it discards, and each block's copy
copies the function's whole scope and every variable in it again: a twentieth of a
compile's time, and a third of the objects Python's collector then frees. The blocks of
the copy handed over are taken as they are instead (_HandedOverBlock).

Two of numba's passes have nothing to do in a kernel, which makes no closures, list
comprehensions, array expressions or constant arrays: InlineClosureLikes (closures,
arrays built by comprehensions, reductions, stencils) and NopythonRewrites (array
expressions, calls on constant arrays, getitems by string literals). Each still walks the
IR and works out its variables' lifetimes two or three times; a serial kernel's pipeline
leaves both out (the machine code of every kernel a warmup of everything compiles is the
same without them), the parallel driver's keeps them.
"""

import copy
import functools

from numba.core import ir, types
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.typed_passes import NopythonRewrites
from numba.core.untyped_passes import FixupArgs, InlineClosureLikes, InlineInlinables


@register_pass(mutates_CFG=False, analysis_only=False)
class LiteralArgumentsAsConstants(FunctionPass):
    """Each literal integer or boolean argument's value becomes a constant of the IR."""

    _name = "literal_arguments_as_constants"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        changed = False
        for block in state.func_ir.blocks.values():
            for i, statement in enumerate(block.body):
                if not (isinstance(statement, ir.Assign) and isinstance(statement.value, ir.Arg)):
                    continue
                given = state.args[statement.value.index]
                if isinstance(given, (types.IntegerLiteral, types.BooleanLiteral)):
                    constant = ir.Const(given.literal_value, statement.loc)
                    block.body[i] = ir.Assign(constant, statement.target, statement.loc)
                    # the definition the pruning reads: left as the argument, the pruning
                    # before inlining kept every branch, and each callee in them was
                    # inlined before a later pruning dropped it
                    state.func_ir._definitions[statement.target.name] = [constant]
                    changed = True
        return changed


# (function, flags) -> its IR after numba's untyped passes, as the inliner makes it
_UNTYPED_IR = {}


def _untyped_ir_once(worker, run_untyped_passes, function, enable_ssa=False):
    """``worker.run_untyped_passes(function, enable_ssa)``, made once per function and flags
    (``run_untyped_passes`` is numba's own, bound to ``worker``)."""
    worker.flags.enable_ssa = enable_ssa  # as numba's sets it, on the compile's own flags
    key = (function, worker.flags.copy())
    if key not in _UNTYPED_IR:
        _UNTYPED_IR[key] = run_untyped_passes(function, enable_ssa)
    return _handed_over_copy(_UNTYPED_IR[key])


class _HandedOverBlock(ir.Block):
    """A block of a copy of an inlined function's IR made for one call site alone: numba's
    inliner takes it as its own copy instead of copying it again. An ir.Block again once
    the inlining pass is done (InlineInlinablesOnce.run_pass)."""

    def __deepcopy__(self, memo):
        return self


def _handed_over_copy(function_ir):
    """A copy of ``function_ir`` for one call site, its blocks _HandedOverBlock: copied
    with one memo, they share one copy of the scope, as the blocks copied share theirs."""
    result = function_ir.copy()
    memo = {}
    result.blocks = {}
    for label, block in function_ir.blocks.items():
        block = copy.deepcopy(block, memo)
        block.__class__ = _HandedOverBlock
        result.blocks[label] = block
    return result


@register_pass(mutates_CFG=True, analysis_only=False)
class InlineInlinablesOnce(InlineInlinables):
    """numba's InlineInlinables, each inlined function's untyped IR made once per process
    (_untyped_ir_once) and copied once per call site (_handed_over_copy)."""

    _name = "inline_inlinables_once"

    def run_pass(self, state):
        changed = super().run_pass(state)
        for block in state.func_ir.blocks.values():  # later passes copy blocks for real
            if isinstance(block, _HandedOverBlock):
                block.__class__ = ir.Block
        return changed

    def _do_work(self, state, work_list, block, i, expr, inline_worker):
        if "run_untyped_passes" not in vars(inline_worker):
            inline_worker.run_untyped_passes = functools.partial(
                _untyped_ir_once, inline_worker, inline_worker.run_untyped_passes)
        return super()._do_work(state, work_list, block, i, expr, inline_worker)


# numba's passes that find nothing to change in a serial kernel (above)
_NOTHING_TO_DO = (InlineClosureLikes, NopythonRewrites)


class LiteralKindsCompiler(CompilerBase):
    """numba's nopython pipeline, literal arguments made constants before any pruning,
    each inlined function's untyped IR made once (InlineInlinablesOnce), and without
    _NOTHING_TO_DO unless the function is parallel."""

    def define_pipelines(self):
        manager = DefaultPassBuilder.define_nopython_pipeline(self.state)
        manager.add_pass_after(LiteralArgumentsAsConstants, FixupArgs)
        parallel = self.state.flags.auto_parallel.enabled
        manager.passes = [(InlineInlinablesOnce if pass_ is InlineInlinables else pass_, name)
                          for pass_, name in manager.passes
                          if parallel or pass_ not in _NOTHING_TO_DO]
        manager.finalize()
        return [manager]

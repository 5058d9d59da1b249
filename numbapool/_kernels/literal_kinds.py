"""A compiler pipeline that compiles only the branches a kernel's literal kinds take.

numba types and lowers every branch of a function, even one whose condition compares a
literal argument with a constant (``if p_kind == 0:`` compiled for ``Literal[int](2)``):
its dead-branch pruning resolves arguments only against None. Every callee in a branch a
kind never takes was typed and compiled all the same, a large part of a first call. This
pipeline turns each literal integer or boolean argument into a constant before numba's
pruning runs, so that its pruning (before and after inlining) drops those branches.
"""

from numba.core import ir, types
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.untyped_passes import FixupArgs


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


class LiteralKindsCompiler(CompilerBase):
    """numba's nopython pipeline, literal arguments made constants before any pruning."""

    def define_pipelines(self):
        manager = DefaultPassBuilder.define_nopython_pipeline(self.state)
        manager.add_pass_after(LiteralArgumentsAsConstants, FixupArgs)
        manager.finalize()
        return [manager]

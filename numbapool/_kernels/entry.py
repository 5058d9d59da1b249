"""Serial entry points: a kernel, and the kinds its loops are compiled for.

Every kernel runs work units on the calling thread: ``(unit_begin, unit_end, *arguments,
*kinds)``. A kernel specialized per kind (the columns and fixed windows, the global sums per
kind of p) takes its kinds last and is compiled with them as literals: numba compiles that
kind's loops with the kinds constant, and a first call compiles its own kind only.

The compiled specialization is called itself: from Python through its own wrapper, from a
parallel driver through a trampoline at the address of its machine code (parallel.py). A
jitted function between the two,
such as a closure over the kinds, would link the kernel's code into its own, and LLVM would
optimize and compile it all a second time: about half a second of a first call.
"""

from typing import NamedTuple

from numba import types

from .. import _numba
from . import collector_paused


class Compiled(NamedTuple):
    """An entry point compiled for one set of argument types."""

    function: object  # called from Python: (unit_begin, unit_end, *arguments, *kinds)
    address: int  # its machine code, which a parallel driver's trampoline calls
    argument_types: tuple  # numba's types of its arguments after the unit range
    context: object  # numba's target context that compiled it


class EntryPoint(NamedTuple):
    kernel: object  # a numba dispatcher
    kinds: tuple = ()  # its last arguments, compiled as literals
    inputs: int = 1  # its first arguments: arrays it only reads

    def compile(self, arguments: tuple) -> Compiled:
        """The kernel compiled (or loaded from the disk cache) for ``arguments``, which end
        with the kinds. Valid as long as the dispatcher lives (the kernels are module
        globals). The caller keeps it per argument types: the function it returns does not
        check them.

        The inputs are compiled as read-only arrays whatever their flags (a flag is part of
        an array's numba type, not of its layout), so that one compilation serves writable
        and read-only inputs."""
        given = [
            _numba.argument_type(self.kernel, a)
            for a in arguments[: len(arguments) - len(self.kinds)]
        ]
        return self.compile_types(tuple(given))

    def compile_types(self, argument_types: tuple) -> Compiled:
        """The kernel compiled (or loaded) for arguments of ``argument_types`` (the kinds'
        left out): what ``compile`` does for arguments of those types, without them
        (warmup compiles so)."""
        _numba.check_runtime()
        given = list(argument_types)
        given[: self.inputs] = [array.copy(readonly=True) for array in given[: self.inputs]]
        signature = (
            (types.int64, types.int64)
            + tuple(given)
            + tuple(types.literal(kind) for kind in self.kinds)
        )
        with collector_paused():
            self.kernel.compile(signature)
        function, address, context = _numba.compiled_overload(self.kernel, signature)
        return Compiled(function, address, signature[2:], context)

"""The parallel driver: a prange over runs of work units, each run handed to a serial
entry point (entry.py) through the address of its machine code.

Called by name, numba would link the entry point's code into the driver and optimize and
compile it a second time. Called through its address (an argument, so the driver's code
holds no constant that differs between processes, and loads from the disk cache), the
driver compiles in well under a second per argument types, whatever kernel it runs, and
the kernel's loops compile once.
"""

from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import kernel
from .threads import use_threads
from .units import chunk_units


@intrinsic
def _call_units(typingctx, address, unit_begin, unit_end, arguments):
    """Call the numba-compiled function at ``address``, compiled for (int64, int64, *the
    types of ``arguments``) and returning None, on units [unit_begin, unit_end)."""
    if not isinstance(address, types.Integer) or not isinstance(arguments, types.BaseTuple):
        return None
    callee_types = (types.int64, types.int64) + tuple(arguments.types)

    def codegen(context, builder, signature, args):
        address_value, begin, end, packed = args
        values = [context.cast(builder, begin, signature.args[1], types.int64),
                  context.cast(builder, end, signature.args[2], types.int64)]
        values += [builder.extract_value(packed, i) for i in range(len(arguments.types))]
        function_type = context.call_conv.get_function_type(types.none, callee_types)
        callee = builder.inttoptr(address_value, function_type.as_pointer())
        status, _ = context.call_conv.call_function(builder, callee, types.none, callee_types,
                                                    values)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return context.get_dummy_value()

    return types.none(address, unit_begin, unit_end, arguments), codegen


@kernel(parallel=True)
def run_in_parallel(address, units, chunks, threads, arguments):
    """Units [0, units) of the serial entry point at ``address`` (compiled for (int64,
    int64, *the types of ``arguments``)), in ``chunks`` runs on ``threads`` threads."""
    before = use_threads(threads)
    for chunk in prange(chunks):
        unit_begin, unit_end = chunk_units(chunk, chunks, units)
        _call_units(address, unit_begin, unit_end, arguments)
    use_threads(before)


def compile_driver(arguments: tuple):
    """run_in_parallel compiled (or loaded from the disk cache) for ``arguments`` (their
    inputs already read-only) and int64 address and counts: the compiled function itself,
    which does not check its argument types. Compiled by signature rather than by a first
    call, which would first look up every numba extension installed (20 ms of a first
    call in a fresh process)."""
    signature = (types.int64,) * 4 + (run_in_parallel.typeof_pyval(arguments),)
    run_in_parallel.compile(signature)
    return run_in_parallel.overloads[signature].entry_point

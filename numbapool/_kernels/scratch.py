"""The kernels' scratch arrays and flat views, built by code lowered in place.

The kernels compile without numba's reference counting (``_kernels.kernel``): with it, numba
emits a reference count's increment and decrement for every array a statement names,
inlined helper by inlined helper, which it lowers and LLVM then optimizes away, about a
tenth of a first call's compile (docs/performance.md). A kernel's scratch arrays are then
its own to free: ``empty`` allocates one (a MemoryError if it cannot), its data aligned
as numba aligns arrays, and ``release`` frees it, through numba's runtime (_numba, 5.);
every kernel releases each scratch array it made before it returns
(tests/test_first_call.py counts the allocations and frees of every kind of kernel).
``empty`` is also what ``np.empty`` would compile once per signature in each process.
``flat_view`` views a 2-D array as one row in place of ``reshape(size)``, whose shape
normalizer numba compiles once per process.
"""

from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import _numba

# numba's alignment of an array's data (BaseContext.get_preferred_array_alignment)
_ALIGNMENT = 32


def _one_axis(context, builder, array_type, data, length, itemsize, meminfo, parent):
    """A 1-D ``array_type`` of ``length`` elements at ``data``: its fields set here, as
    numba.np.arrayobj's populate_array sets them (a module whose import took 18 ms of
    numbapool's)."""
    array = context.make_array(array_type)(context, builder)
    array.meminfo = meminfo
    array.parent = parent if parent is not None else cgutils.get_null_value(array.parent.type)
    array.nitems = length
    array.itemsize = itemsize
    array.data = data
    array.shape = cgutils.pack_array(builder, [length])
    array.strides = cgutils.pack_array(builder, [itemsize])
    return array._getvalue()


def allocation(array_type):
    """The codegen of a new 1-D ``array_type`` of ``args[0]`` elements: a MemInfo of numba's
    runtime that owns the data, which ``release`` frees."""

    def codegen(context, builder, signature, args):
        length = context.cast(builder, args[0], signature.args[0], types.intp)
        element = context.get_data_type(array_type.dtype)
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(element))
        size = builder.mul(length, itemsize)
        meminfo = _numba.allocate_aligned(context, builder, size, _ALIGNMENT)
        with cgutils.if_unlikely(builder, cgutils.is_null(builder, meminfo)):
            _numba.raise_in_kernel(
                context, builder, MemoryError, ("numbapool: no memory for a scratch array",)
            )
        data = builder.bitcast(_numba.data_of(builder, meminfo), element.as_pointer())
        return _one_axis(context, builder, array_type, data, length, itemsize, meminfo, None)

    return codegen


@intrinsic
def empty(typingctx, size, dtype):
    """np.empty(size, dtype): a new 1-D array, ``dtype`` a numpy scalar type (np.int64) or
    an array's dtype (x.dtype)."""
    if isinstance(dtype, types.NumberClass):
        element = dtype.instance_type
    elif isinstance(dtype, types.DType):
        element = dtype.dtype
    else:
        return None
    if not isinstance(size, types.Integer):
        return None
    array_type = types.Array(element, 1, "C")
    return array_type(size, dtype), allocation(array_type)


@intrinsic
def release(typingctx, *arrays):
    """Free scratch arrays made by ``empty``, none of them used again."""
    if not all(isinstance(array, types.Array) and array.ndim == 1 for array in arrays):
        return None

    def codegen(context, builder, signature, args):
        for i, array in enumerate(arrays):
            value = builder.extract_value(args[0], i)
            _numba.release_meminfo(
                builder, context.make_array(array)(context, builder, value).meminfo
            )
        return context.get_dummy_value()

    return types.none(types.StarArgTuple.from_types(arrays)), codegen


@njit(inline="always")
def full(size, value, dtype):
    """np.full(size, value, dtype), through ``empty``."""
    array = empty(size, dtype)
    for i in range(size):
        array[i] = value
    return array


@intrinsic
def flat_view(typingctx, array):
    """array.reshape(array.size) for a C-contiguous array: its buffer as one axis, built in
    place (numba's reshape compiles a helper of its own in each process and checks the new
    shape in a call at run time)."""
    if not (isinstance(array, types.Array) and array.layout == "C"):
        return None
    result = array.copy(ndim=1)

    def codegen(context, builder, signature, args):
        source = context.make_array(array)(context, builder, args[0])
        view = _one_axis(
            context,
            builder,
            result,
            source.data,
            source.nitems,
            source.itemsize,
            source.meminfo,
            source.parent,
        )
        return _numba.borrowed(context, builder, result, view)

    return result(array), codegen

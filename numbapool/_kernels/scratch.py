"""The kernels' scratch arrays and flat views, built by code lowered in place.

numba's ``np.empty`` and ``np.full`` are functions that numba compiles once per signature in
each process, and never caches on disk: a first call in a fresh process compiled them for
0.15 to 0.35 s (a first LpPool the most). ``empty`` allocates the same array from within
the kernel's own code. ``flat_view`` does the same for ``reshape(size)``, whose shape
normalizer numba compiles once per process.
"""

from numba import njit, types
from numba.core.imputils import impl_ret_borrowed, impl_ret_new_ref
from numba.extending import intrinsic
from numba.np.arrayobj import _empty_nd_impl, make_array, populate_array


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

    def codegen(context, builder, signature, args):
        length = context.cast(builder, args[0], signature.args[0], types.intp)
        array = _empty_nd_impl(context, builder, array_type, [length])
        return impl_ret_new_ref(context, builder, array_type, array._getvalue())

    return array_type(size, dtype), codegen


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
        source = make_array(array)(context, builder, args[0])
        view = make_array(result)(context, builder)
        populate_array(view, data=source.data, shape=[source.nitems], strides=[source.itemsize],
                       itemsize=source.itemsize, meminfo=source.meminfo, parent=source.parent)
        return impl_ret_borrowed(context, builder, result, view._getvalue())

    return result(array), codegen

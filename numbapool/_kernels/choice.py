"""Which family serves a call: the first in FAMILIES that serves it (family.Family).

Each family's module declares it (kernel, kinds, when it serves a call, its arguments);
this order alone says which wins where several could serve. The specialized families come
before the general ones they are faster than, and every operator ends with a family that
serves every call of it: MaxPool with Indices the generic maxima, without them the columns
kernel, AveragePool and LpPool the generic sums, the global sums the in-order ones.
"""

from . import columns, fixed, global_, indexed, max_planes, maxima, planes, sums, wide

FAMILIES = (
    # MaxPool with Indices
    indexed.FAMILY,
    maxima.FAMILY,
    # MaxPool without Indices
    fixed.MAX_FAMILY,
    max_planes.FAMILY,
    columns.ROW_FAMILY,
    columns.FAMILY,
    # AveragePool and LpPool
    fixed.SUM_FAMILY,
    planes.FAMILY,
    wide.FAMILY,
    sums.FAMILY,
    # the global pools
    global_.MAX_FAMILY,
    global_.HALF_LINE_FAMILY,
    global_.BLOCK_SUM_FAMILY,
    global_.REORDERED_FAMILY,
    global_.IN_ORDER_FAMILY,
)


def choose(request, indices: bool = False):
    """(family, kinds) of the first family in FAMILIES that serves ``request``
    (family.WindowRequest or family.GlobalRequest), with MaxPool's Indices or without."""
    for family in FAMILIES:
        if request.op not in family.ops or family.indices != indices:
            continue
        if family.whole_rows and not request.whole_rows():
            continue
        kinds = family.serves(request)
        if kinds is not None:
            return family, kinds
    raise LookupError(f"numbapool: no kernel family serves {request!r}")

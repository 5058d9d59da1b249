"""MaxUnpool: scatter each input element to the position its index names."""

import numpy as np

from . import kernel


@kernel()
def max_unpool(x, indices, y, default_spatial, out_strides):
    """``x`` and ``indices`` flat; ``y`` (N*C, prod(output spatial)), zeroed. An index addresses the default
    output (N*C blocks of prod(default_spatial)); its coordinates land at the same place in
    ``y``, whose spatial strides are ``out_strides``. Serial, so a repeated index keeps the
    last element in row-major order, as a scatter does."""
    rank = default_spatial.shape[0]
    channel_size = 1
    for axis in range(rank):
        channel_size *= default_spatial[axis]
    for i in range(x.shape[0]):
        nc, rest = divmod(indices[i], channel_size)
        offset = 0
        for axis in range(rank - 1, -1, -1):
            rest, position = divmod(rest, default_spatial[axis])
            offset += position * out_strides[axis]
        y[nc, offset] = x[i]

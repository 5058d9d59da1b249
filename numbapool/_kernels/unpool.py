"""MaxUnpool: scatter each input element to the position its index names."""

from . import kernel


@kernel()
def max_unpool(x, indices, y):
    """``x``, ``indices`` and the zeroed output ``y`` flat: each index is a row-major position
    in the output, N and C included. Serial, so a repeated index keeps the last element in
    row-major order, as a scatter does."""
    for i in range(x.shape[0]):
        y[indices[i]] = x[i]

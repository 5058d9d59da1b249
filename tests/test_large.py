"""Inputs of more than 2**31 elements: offsets and indices need 64 bits everywhere.

The inputs are broadcast views (no memory); numbapool copies them once into C order
(2.1 GB and 4.3 GB here), which the machine running the suite must hold.
"""

import numpy as np

import numbapool

BIG = 2**31


def test_max_pool_indices_past_2_to_the_31():
    length = 2**14 + 3
    channels = BIG // length + 1  # the last channels start past offset 2**31
    base = (np.arange(length) * 7919 % 251).astype(np.uint8)
    x = np.broadcast_to(base, (1, channels, length))
    assert x.size > BIG
    y, indices = numbapool.max_pool(x, [1024], strides=[1024], return_indices=True)
    windows = base[: 16 * 1024].reshape(16, 1024)
    expected_offsets = windows.argmax(axis=1) + np.arange(16) * 1024  # first maximum
    np.testing.assert_array_equal(y[0], np.broadcast_to(windows.max(axis=1), (channels, 16)))
    np.testing.assert_array_equal(
        indices[0], np.arange(channels)[:, None] * length + expected_offsets[None, :]
    )
    assert indices.max() > BIG


def test_global_average_pool_of_channels_past_2_to_the_30():
    length = 2**30 + 1
    x = np.broadcast_to(np.float16(0.5), (1, 2, length))
    assert x.size > BIG
    np.testing.assert_array_equal(
        numbapool.global_average_pool(x), np.full((1, 2, 1), 0.5, np.float16)
    )
    np.testing.assert_array_equal(numbapool.global_max_pool(x), np.full((1, 2, 1), 0.5, np.float16))

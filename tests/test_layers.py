"""jaxzoo.layers.patches: a convolution written as patches @ kernel is the
convolution (the MinAtar 3x3 of ppo, rainbow, unizero and unizero_ppo, and the
stride-2 convolutions of planet and world_models use it)."""

import jax
import numpy as np
import pytest

from jaxzoo import layers


@pytest.mark.parametrize("kernel_size, stride, size", [(3, 1, 10), (4, 2, 64), (5, 2, 13), (3, 2, 7)])
def test_patches_times_kernel_is_the_valid_convolution(kernel_size, stride, size):
    x_key, k_key = jax.random.split(jax.random.key(kernel_size * 10 + stride))
    x = jax.random.normal(x_key, (2, size, size, 3))  # [B, H, W, C]
    kernel = jax.random.normal(k_key, (kernel_size, kernel_size, 3, 5))  # HWIO
    expected = jax.lax.conv_general_dilated(
        x, kernel, (stride, stride), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"),
        precision=jax.lax.Precision.HIGHEST,
    )
    patches = layers.patches(x, kernel_size, stride)
    out = (size - kernel_size) // stride + 1
    assert patches.shape == (2, out, out, kernel_size * kernel_size * 3)
    np.testing.assert_allclose(patches @ kernel.reshape(-1, 5), expected, rtol=1e-5, atol=1e-5)


def test_patches_keep_leading_axes():
    x = np.arange(2 * 3 * 10 * 10 * 4, dtype=np.float32).reshape(2, 3, 10, 10, 4)  # [T, N, H, W, C]
    patches = layers.patches(x, 3)
    assert patches.shape == (2, 3, 8, 8, 36)
    # Tap (i, j) sits in channels [(3i + j) C, (3i + j + 1) C).
    np.testing.assert_array_equal(patches[..., 5, 2, (3 * 1 + 2) * 4 : (3 * 1 + 2 + 1) * 4], x[..., 6, 4, :])

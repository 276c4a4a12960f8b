"""64-bit index math: the generated functions address memory with 64-bit offsets only, and
their 64-bit arguments keep their meaning whatever their size (row positions past 2**31 in
planes that wide, or padded that far); the whole path on an output of more than 2**31
elements runs with CSO_LONG_TESTS=1."""
import os
import re

import numpy as np
import pytest
from llvmlite import ir

import cso
from microkernels import (DepthwiseSpec, KernelSpec, RowCopySpec, TapCopySpec, TransposeSpec,
                          compile, depthwise, outer_product, row_copy, transpose)

from .reference import conv2d_reference



def generated_ir(dtype, isa):
    lanes = {"avx512": 64, "avx2": 32, "generic": 16}[isa] // (4 if dtype == "f32" else 8)
    module = ir.Module()
    for variant in ("packed", "slab", "direct"):
        outer_product.define_kernel(module, KernelSpec(dtype, 7, 2 * lanes, isa, variant))
    row_copy.define_row_copy(module, RowCopySpec(dtype, 2 * lanes + 3, isa))
    row_copy.define_tap_copy(module, TapCopySpec(dtype, 2 * lanes, isa))
    transpose.define_transpose(module, TransposeSpec(dtype, isa))
    depthwise.define_depthwise(module, DepthwiseSpec(dtype, 3, isa))
    return str(module)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_every_address_offset_is_64_bit(dtype, isa):
    """Every getelementptr index and every integer turned into an address is 64-bit: no
    offset is computed in 32 bits."""
    text = generated_ir(dtype, isa)
    geps = [line for line in text.splitlines() if "getelementptr" in line]
    assert geps
    index_types = set(re.findall(r", (i\d+|<\d+ x i\d+>) ", " ".join(geps)))
    assert index_types <= {"i64", "<4 x i64>", "<8 x i64>", "<16 x i64>"}, index_types
    assert not re.search(r"inttoptr (i32|i16|<\d+ x i32>)", text)


@pytest.mark.parametrize("lo,hi,inside", [
    (-(2 ** 31) - 7, 2 ** 32 + 5, True),      # the whole run inside a row wider than 2**31
    (-(2 ** 40), 2 ** 40, True),
    (2 ** 32, 2 ** 32 + 9, False),            # a run in the padding, 2**32 columns before it
    (-(2 ** 33), -(2 ** 32), False),
])
def test_row_positions_past_2_to_the_31_keep_their_meaning(lo, hi, inside):
    """copy_taps's ``lo`` and ``hi`` are positions in the input row: they can pass 2**31 (a
    row that wide, or padded that far) and must not wrap in its 32-bit lane arithmetic."""
    width, taps = 32, 3
    src = np.arange(1, 2 * width + taps + 1, dtype=np.float32)
    dst = np.full(taps * width, np.nan, np.float32)
    compile(TapCopySpec("f32", width, "avx512"))(dst, 0, 0, width, src, 0, 0, 1, taps, 1, 0,
                                                  width, width, lo, hi)
    expected = np.stack([src[s:s + width] for s in range(taps)]).reshape(-1)
    np.testing.assert_array_equal(dst, expected if inside else np.zeros_like(expected))


@pytest.mark.skipif(os.environ.get("CSO_LONG_TESTS") != "1",
                    reason="CSO_LONG_TESTS=1: an output of 2**31 elements (8.6 GB, about a minute)")
def test_an_output_of_more_than_2_to_the_31_elements():
    """A 3 x 3 convolution whose output plane has more than 2**31 elements, its input placed
    at the far end by padding: the values past element 2**31 are where they belong."""
    x = np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3)
    w = np.ones((1, 1, 3, 3), np.float32)
    top_left = 46_400   # output 46402 x 46402 = 2,153,145,604 elements
    y = cso.conv2d(x, w, padding=((top_left, 1), (top_left, 1)))
    assert y.size > 2 ** 31
    # the last 5 x 5 outputs read the last 7 x 7 padded rows and columns: 3 of padding, the
    # input, 1 of padding
    patch = np.pad(x, ((0, 0), (0, 0), (3, 1), (3, 1)))
    np.testing.assert_array_equal(y[0, 0, -5:, -5:], conv2d_reference(patch, w)[0, 0])
    assert not y[0, 0, :-5].any() and not y[0, 0, -5:, :-5].any()

"""The ONNX operators other than Conv: ``OPERATORS[op_type](node, constants)`` builds one at
load time and returns ``run(*inputs) -> tuple of outputs`` (see ``registry``).

The operators are in families, each a module that registers its builders in ``registry``:
``ops_elementwise`` (arithmetic, comparisons, Where, Cast), ``ops_reduce`` (the Reduce*
operators), ``ops_pooling`` (compiled pools), ``ops_normalization`` (BatchNormalization, LRN,
LayerNormalization), ``ops_shapes`` (shape arithmetic, indexing, Concat, Reshape, Split...),
``ops_spatial`` (Pad, Resize, Upsample), ``ops_matrix`` (Gemm, MatMul, Softmax) and
``ops_activation`` (Clip, Sigmoid, HardSwish, Gelu... as compiled kernels). Importing this
module registers them all.
"""
from . import (ops_activation, ops_elementwise, ops_matrix, ops_normalization,  # noqa: F401
               ops_pooling, ops_reduce, ops_shapes, ops_spatial)
from .registry import CAPTURES_CONSTANTS, OPERATORS, TAKES_OUT

__all__ = ["CAPTURES_CONSTANTS", "OPERATORS", "TAKES_OUT"]

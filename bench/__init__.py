"""Benchmarks: ``python -m bench`` times cso against im2col + NumPy GEMM on ResNet-50 layers
and relates the result to the core's measured FMA peak.

Nothing is imported here: ``bench.__main__`` must pin NumPy's BLAS threads before NumPy loads.
"""

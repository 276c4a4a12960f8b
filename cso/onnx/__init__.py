"""Run ONNX CNNs with cso: ``cso.onnx.load(path)`` packs every Conv's filters once, fuses what
follows it (``fusion``), and runs the other operators as compiled kernels on cso's threads
(pools, LRN, per-channel affine maps, Softmax) or in vectorised NumPy
(``pip install 'cso[onnx]'``)."""
from .model import Model, load
from .node import UnsupportedModel

__all__ = ["Model", "UnsupportedModel", "load"]

"""Run ONNX CNNs with cso: ``cso.onnx.load(path)`` packs every Conv's filters once, fuses what
follows it, and runs every other operator in vectorised NumPy (``pip install 'cso[onnx]'``)."""
from .model import Model, load
from .node import UnsupportedModel

__all__ = ["Model", "UnsupportedModel", "load"]

"""Run ONNX CNNs: every Conv a prepared ``cso.Conv2d``, everything else vectorised NumPy."""

"""Layers and a model the pickling and cso.dask tests share."""
import numpy as np

CONV_CASES = {   # Conv2d arguments besides the weight, which has 13 filters (a padded last tile)
    "plain": dict(),
    "bias_relu_same": dict(bias=True, padding="same", activation="relu"),
    "strided_asymmetric": dict(stride=2, padding=((1, 0), (2, 1)), dilation=(1, 2)),
    "grouped_input_shape": dict(groups=13, bias=True, padding=1, input_shape=(2, 13, 9, 11)),
    "overrides": dict(padding=1, plan_overrides=dict(vectors_along="windows")),
}


def images(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def conv_case(rng, case, channels=13):
    """(weight, bias or None, other Conv2d arguments) of ``CONV_CASES[case]``."""
    kwargs = dict(CONV_CASES[case])
    weight = images(rng, (13, channels // kwargs.get("groups", 1), 3, 3))
    bias = images(rng, (13,)) if kwargs.pop("bias", False) else None
    return weight, bias, kwargs


def light_model():
    """SqueezeNet from the onnx package with random weights, for any batch size (input
    (batch, 3, 224, 224), output (batch, 1000, 1, 1))."""
    import onnx

    import cso.onnx
    from bench.models import batch_generic, model_path, random_weights
    return cso.onnx.load(batch_generic(random_weights(onnx.load(model_path("squeezenet")))))

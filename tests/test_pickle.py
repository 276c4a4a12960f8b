"""Layers and models leave their process: Conv2d and cso.onnx.Model pickle and deep-copy as
their weights and arguments, and the copies compute the same bits."""
import copy
import gc
import pickle

import numpy as np
import pytest

import cso

from .layers import CONV_CASES, conv_case, images, light_model


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_pickles_as_its_weights_and_arguments(rng, case):
    weight, bias, kwargs = conv_case(rng, case)
    conv = cso.Conv2d(weight, bias, **kwargs)
    x = images(rng, (2, 13, 9, 11))
    expected = conv(x)
    data = pickle.dumps(conv)
    # the filters once, not their packed copy, nor anything compiled
    assert weight.nbytes < len(data) < weight.nbytes + (0 if bias is None else bias.nbytes) + 1024
    copies = [pickle.loads(data), copy.deepcopy(conv)]
    del conv
    gc.collect()
    for other in copies:   # they work without the original
        assert np.array_equal(other(x), expected)
        assert np.array_equal(pickle.loads(pickle.dumps(other))(x), expected)


def test_conv2d_copy_prepares_its_input_shape(rng):
    weight, bias, kwargs = conv_case(rng, "grouped_input_shape")
    conv = cso.Conv2d(weight, bias, **kwargs)
    other = pickle.loads(pickle.dumps(conv))
    assert list(other._by_shape) == list(conv._by_shape)   # prepared when loaded, as conv was
    assert other.plan_for(kwargs["input_shape"]) == conv.plan_for(kwargs["input_shape"])


def test_model_pickles_and_copies(rng):
    pytest.importorskip("onnx")
    model = light_model()
    x = images(rng, (2, 3, 224, 224))
    expected = model(x)
    convs = [step.run.conv for step in model.steps if step.label.startswith("Conv")]
    weights = sum(int(np.prod(conv.weight_shape)) * conv.dtype.itemsize for conv in convs)
    data = pickle.dumps(model)
    assert len(data) < 1.1 * weights   # not their packed copies
    copies = [pickle.loads(data), copy.deepcopy(model)]
    del model
    gc.collect()
    for other in copies:
        assert np.array_equal(other(x), expected)

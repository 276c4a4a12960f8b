"""torchvision's classification CNNs, one per family at reduced width or input size, exported
with random weights by the TorchScript exporter (opset 17) and the dynamo exporter (opset 18)
(``tests/data/zoo/make_models.py``): each loads and gives onnxruntime's output within 1e-4 of
its largest magnitude, and EfficientNet-B0 (ts17) a float64 evaluation's within 1e-4.

onnxruntime's float32 sigmoid is itself 2.1e-4 off a float64 evaluation of that
EfficientNet-B0, where cso is 2.2e-5 off (cso and onnxruntime 2.3e-4 apart): against
onnxruntime it alone is allowed 5e-4, onnxruntime's error, and is held to 1e-4 against
float64."""
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import cso.onnx  # noqa: E402

from bench.models import onnxruntime_session, relative_error  # noqa: E402

ZOO = Path(__file__).parent / "data" / "zoo"
MODELS = sorted(ZOO.glob("*.onnx"))


def test_the_set_covers_every_family_with_both_exporters():
    families = {path.name.split(".")[0] for path in MODELS}
    assert len(families) == 18 and len(MODELS) >= 36
    assert all((ZOO / f"{family}.{exporter}.onnx").is_file()
               for family in families for exporter in ("ts17", "dy18"))


# onnxruntime's own float32 error on this model's sigmoids (see above)
ONNXRUNTIME_OFF = {"efficientnet_b0.ts17": 5e-4}


@pytest.mark.parametrize("path", MODELS, ids=[path.stem for path in MODELS])
def test_exported_cnn_matches_onnxruntime(path, rng):
    bound = ONNXRUNTIME_OFF.get(path.stem, 1e-4)
    model = cso.onnx.load(path)
    (name,) = model.input_names
    shape, dtype = model.inputs[name]
    x = rng.standard_normal(shape).astype(dtype)
    (ours,) = model.run(None, {name: x})
    (theirs,) = onnxruntime_session(str(path), 1).run(None, {name: x})
    assert ours.shape == theirs.shape
    assert relative_error(ours, theirs) <= bound
    (again,) = model.run(None, {name: 2 * x})   # a replay of the recorded run, on other data
    (theirs,) = onnxruntime_session(str(path), 1).run(None, {name: 2 * x})
    assert relative_error(again, theirs) <= bound


def float64_copy(model):
    """``model`` with its float32 constants, inputs and outputs in float64."""
    from onnx import TensorProto, numpy_helper
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    tensors = list(copy.graph.initializer) + [a.t for n in copy.graph.node for a in n.attribute
                                              if a.name == "value"]
    for t in tensors:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64),
                                               t.name))
    for value in list(copy.graph.input) + list(copy.graph.output):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    del copy.graph.value_info[:]
    return copy


def test_a_silu_network_is_within_1e_4_of_a_float64_evaluation(rng):
    from onnx.reference import ReferenceEvaluator
    path = ZOO / "efficientnet_b0.ts17.onnx"
    model = cso.onnx.load(path)
    (name,) = model.input_names
    x = rng.standard_normal(model.inputs[name][0]).astype(np.float32)
    (ours,) = model.run(None, {name: x})
    (exact,) = ReferenceEvaluator(float64_copy(onnx.load(path))).run(None, {name: x.astype(
        np.float64)})
    assert relative_error(ours, exact) <= 1e-4

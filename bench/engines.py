"""The engines compared, each built once per layer as ``engine(spec, w) -> run(x)``, plus an
independent float64 reference that every engine's output is checked against before timing.

Each engine is fed its own layout (``LAYOUTS``; NCHW where it names none): the input is
converted before the timed calls (``fed``) and the output back to NCHW for the check after
them (``as_nchw``)."""
import contextlib
import os

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

import cso


CSO_OPTIONS = {}   # options every cso engine of the run gets (``python -m bench --tune``)


def cso_engine(spec, w, threads=1, **options):
    """cso.Conv2d (``options`` and CSO_OPTIONS go to it) loaded for the spec's input shape, as
    a model would be: filters packed (and with ``tune=True`` the plan tuned) here, outside the
    timed calls; cso may use ``threads`` threads (a process-wide setting, the same for every
    engine of a run)."""
    options = {**CSO_OPTIONS, **options}
    cso.set_num_threads(threads)
    t, b, l, r = spec.padding
    return cso.Conv2d(w, stride=spec.stride, padding=((t, b), (l, r)), dilation=spec.dilation,
                      groups=spec.groups, input_shape=spec.input_shape, **options)


def cso_blocked_engine(spec, w, threads=1):
    """cso on channel-blocked values (``cso.Blocked``, blocks of the vector width) in and out,
    as layers chained in a model keep them."""
    return cso_engine(spec, w, threads)


def cso_nhwc_engine(spec, w, threads=1):
    """cso on channels-last arrays in and out (``layout="nhwc"``)."""
    conv = cso_engine(spec, w, threads)
    return lambda x: conv(x, layout="nhwc")


def im2col_engine(spec, w, threads=1):
    """The classic lowering: copy every window into a (C/g*R*S) x (P*Q) matrix per group, then
    one BLAS GEMM per image and group (BLAS threads are set by ``python -m bench --threads``
    before NumPy loads)."""
    g, kg = spec.groups, spec.k_per_group
    w_mat = w.reshape(g, kg, -1)
    t, b, l, r = spec.padding

    def run(x):
        xp = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))
        cols = _windows(spec, xp)                                  # view: N, C, P, Q, R, S
        cols = cols.reshape(spec.n, g, spec.c_per_group, spec.p, spec.q, spec.r, spec.s)
        cols = cols.transpose(0, 1, 2, 5, 6, 3, 4).reshape(spec.n, g, -1, spec.p * spec.q)
        return (w_mat @ cols).reshape(spec.output_shape)          # N, G, Kg, P*Q

    return run


def _windows(spec, xp):
    """Strided view of every window of the padded input: (N, C, P, Q, R, S), no copy."""
    (dh, dw), (sh, sw) = spec.dilation, spec.stride
    span = (dh * (spec.r - 1) + 1, dw * (spec.s - 1) + 1)
    return sliding_window_view(xp, span, axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]


def onnxruntime_engine(spec, w, threads=1):
    """onnxruntime (MLAS) running a one-node ONNX Conv model, ``threads`` intra-op threads."""
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    t, b, l, r = spec.padding
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[t, l, b, r], strides=list(spec.stride),
                            dilations=list(spec.dilation), group=spec.groups)
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, spec.input_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, spec.output_shape)],
        initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"x": x})[0]


def torch_engine(spec, w, threads=1):
    """PyTorch's conv2d (oneDNN on x86) on tensors sharing the NumPy buffers."""
    import torch

    torch.set_num_threads(threads)
    weight = torch.from_numpy(w)
    t, b, l, r = spec.padding
    pad = None if (t, l) == (b, r) else (l, r, t, b)
    padding = (t, l) if pad is None else 0

    def run(x):
        with torch.no_grad():
            xt = torch.from_numpy(x)
            if pad is not None:
                xt = torch.nn.functional.pad(xt, pad)
            return torch.nn.functional.conv2d(xt, weight, None, spec.stride, padding, spec.dilation,
                                              spec.groups).numpy()

    return run


class Unsupported(Exception):
    """An engine cannot run this convolution (its row drops out of every engine's geomean)."""


def xnnpack_engine(spec, w, threads=1):
    """XNNPACK, TensorFlow Lite's CPU engine for float32: a one-layer Keras model (explicit
    pads as a ``ZeroPadding2D``, then ``Conv2D(groups=...)`` or, one channel per group,
    ``DepthwiseConv2D``) converted to TFLite and run by LiteRT's interpreter on NHWC arrays.
    Keras refuses a stride and a dilation both above 1 (``Unsupported``)."""
    if max(spec.stride) > 1 and max(spec.dilation) > 1:
        raise Unsupported("Keras takes no stride and dilation both above 1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with _quiet():   # TensorFlow and the converter print their progress
        import tensorflow as tf
        from ai_edge_litert.interpreter import Interpreter

        t, b, l, r = spec.padding
        x_in = tf.keras.Input((spec.h, spec.w, spec.c), batch_size=spec.n)
        padded = (tf.keras.layers.ZeroPadding2D(((t, b), (l, r)))(x_in) if any(spec.padding)
                  else x_in)
        if spec.c_per_group == 1 and spec.groups > 1:
            layer = tf.keras.layers.DepthwiseConv2D(
                (spec.r, spec.s), spec.stride, depth_multiplier=spec.k_per_group,
                dilation_rate=spec.dilation, use_bias=False)
            kernel = w.reshape(spec.c, spec.k_per_group, spec.r, spec.s).transpose(2, 3, 0, 1)
        else:
            layer = tf.keras.layers.Conv2D(spec.k, (spec.r, spec.s), spec.stride,
                                           dilation_rate=spec.dilation, groups=spec.groups,
                                           use_bias=False)
            kernel = w.transpose(2, 3, 1, 0)
        model = tf.keras.Model(x_in, layer(padded))
        layer.set_weights([kernel])
        interpreter = Interpreter(model_content=tf.lite.TFLiteConverter.from_keras_model(model)
                                  .convert(), num_threads=threads)
        interpreter.allocate_tensors()
    x_index = interpreter.get_input_details()[0]["index"]
    y_index = interpreter.get_output_details()[0]["index"]

    def run(x):
        interpreter.set_tensor(x_index, x)
        interpreter.invoke()
        return interpreter.get_tensor(y_index)

    return run


@contextlib.contextmanager
def _quiet():
    """Standard output and error (the file descriptors: native code writes there) to
    /dev/null."""
    saved = [os.dup(fd) for fd in (1, 2)]
    with open(os.devnull, "w") as null:
        try:
            for fd in (1, 2):
                os.dup2(null.fileno(), fd)
            yield
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


ENGINES = {"cso": cso_engine, "cso-blocked": cso_blocked_engine, "cso-nhwc": cso_nhwc_engine,
           "im2col": im2col_engine, "onnxruntime": onnxruntime_engine, "torch": torch_engine,
           "xnnpack": xnnpack_engine}
LAYOUTS = {"cso-blocked": "blocked", "cso-nhwc": "nhwc", "xnnpack": "nhwc"}
ALWAYS = ("cso", "im2col")
ON_REQUEST = ("cso-blocked", "cso-nhwc")   # cso in other layouts: with --engines only
OPTIONAL_MODULES = {"onnxruntime": ("onnxruntime", "onnx"), "torch": ("torch",),
                    "xnnpack": ("tensorflow", "ai_edge_litert")}


def available_engines():
    """cso and im2col always, onnxruntime, torch and xnnpack when what they need can be
    imported (the default engines); cso in its other layouts (``ON_REQUEST``)."""
    import importlib.util
    found = list(ALWAYS)
    for name, modules in OPTIONAL_MODULES.items():
        if all(importlib.util.find_spec(m) is not None for m in modules):
            found.append(name)
    return found + list(ON_REQUEST)


def default_engines():
    return [e for e in available_engines() if e not in ON_REQUEST]


def fed(engine, x):
    """The NCHW input ``x`` in ``engine``'s layout."""
    layout = LAYOUTS.get(engine, "nchw")
    if layout == "nhwc":
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    return cso.Blocked.from_nchw(x) if layout == "blocked" else x


def as_nchw(engine, y):
    """``engine``'s output ``y`` as NCHW."""
    layout = LAYOUTS.get(engine, "nchw")
    if layout == "nhwc":
        return y.transpose(0, 3, 1, 2)
    return y.to_nchw() if layout == "blocked" else y


def reference(spec, x, w):
    """Direct float64 convolution, one tap (r, s) at a time; shares no code with the engines."""
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    t, b, l, r = spec.padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (t, b), (l, r)))
    xg = xp.reshape(spec.n, spec.groups, spec.c_per_group, *xp.shape[2:])
    wg = w.astype(np.float64).reshape(spec.groups, spec.k_per_group, spec.c_per_group,
                                      spec.r, spec.s)
    out = np.zeros((spec.n, spec.groups, spec.k_per_group, spec.p, spec.q))
    for i in range(spec.r):
        for j in range(spec.s):
            tap = xg[..., i * dh: i * dh + sh * (spec.p - 1) + 1: sh,
                     j * dw: j * dw + sw * (spec.q - 1) + 1: sw]
            out += np.einsum("gkc,ngcpq->ngkpq", wg[..., i, j], tap, optimize=True)
    return out.reshape(spec.output_shape)


def check(name, spec, out, ref, rtol=1e-4):
    """Raise unless ``out`` matches ``ref`` to ``rtol`` of the reference's largest magnitude."""
    err = np.max(np.abs(out - ref)) if out.shape == ref.shape else np.inf
    if not err <= rtol * np.max(np.abs(ref)):
        raise AssertionError(f"{name} is wrong on {spec}: shape {out.shape} vs {ref.shape}, "
                             f"max error {err:.3g}, max |ref| {np.max(np.abs(ref)):.3g}")

"""Batches on a Dask cluster: ``conv2d`` and ``apply`` map cso over the batch chunks of a dask
array (``pip install 'cso[dask]'``).

    y = cso.dask.conv2d(x, weight, bias, padding=1)   # x: a dask array chunked along the batch
    y = cso.dask.apply(model, x)                      # a cso.Conv2d or a cso.onnx.Model

Dask schedules the chunks: its local threads by default, a ``distributed.Client``'s workers
when one is active. A layer reaches a worker once per computation, as one key of the graph that
every chunk depends on, and each worker process keeps the layers it has unpickled (so packed) in
a registry of its own: a layer's filters are packed once per worker process, not once per chunk,
and a later computation with the same layer finds them packed. On a worker, cso runs on as many
threads as the worker has, so that it does not oversubscribe Dask's own threads.
"""
import pickle
import sys
import threading
import uuid
import weakref
from collections import Counter, OrderedDict

import numpy as np

try:
    import dask
    import dask.array as da
except ImportError:
    raise ImportError("cso.dask needs dask: pip install 'cso[dask]'") from None

from . import Conv2d, set_num_threads
from .onnx import Model

REGISTRY_SIZE = 8   # layers a process keeps unpickled, the least recently used dropped first

_tokens = weakref.WeakKeyDictionary()   # layer -> the token that names it in graphs
_registry = OrderedDict()   # token -> layer unpickled in this process
_registry_lock = threading.Lock()
# layers this process has unpickled, so packed, by token (a layer dropped from the registry and
# needed again counts twice): the tests read it on each worker
unpickled = Counter()


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None):
    """``cso.conv2d`` of a dask array ``x`` (N, C, H, W) chunked along the batch N (the other
    axes are rechunked to one chunk each when they are not); ``weight``, ``bias`` and the
    arguments as ``cso.conv2d`` takes them. Returns a dask array chunked like ``x``'s batch."""
    _check_dask_array(x)
    return apply(Conv2d(weight, bias, stride, padding, dilation, groups, activation), x)


def apply(layer, x):
    """Map ``layer`` (a ``cso.Conv2d`` or a ``cso.onnx.Model`` with one input and one output)
    over the batch chunks of the dask array ``x`` (axis 0; the other axes are rechunked to one
    chunk each when they are not). Returns a dask array chunked like ``x``'s batch."""
    _check_dask_array(x)
    if np.isnan(x.shape[1:]).any():
        raise ValueError(f"x's sizes beyond the batch axis must be known, got x of shape "
                         f"{x.shape}")
    if isinstance(layer, Conv2d):
        image_shape, dtype = _conv_output(layer, x)
    elif isinstance(layer, Model):
        image_shape, dtype = _model_output(layer, x)
    else:
        raise TypeError(f"layer must be a cso.Conv2d or a cso.onnx.Model, got "
                        f"{type(layer).__name__}")
    x = x.rechunk({axis: -1 for axis in range(1, x.ndim)})
    shipped = _Shipped(token(layer), layer)
    # one key for the layer, which each worker fetches once, not a copy in every chunk's task
    handle = dask.delayed(shipped, name=f"cso-layer-{shipped.token}", traverse=False)
    # axis 0, the batch, is x's and the output's; the output's other axes are new ones
    axes = range(x.ndim, x.ndim + len(image_shape))
    return da.blockwise(_run, (0, *axes), handle, None, x, tuple(range(x.ndim)),
                        new_axes=dict(zip(axes, image_shape)), concatenate=True, dtype=dtype,
                        meta=np.empty((0,) * (1 + len(image_shape)), dtype), token="cso")


def _check_dask_array(x):
    if not isinstance(x, da.Array):
        raise TypeError(f"x must be a dask array (dask.array.from_array(x, chunks=...)), got "
                        f"{type(x).__name__}")


def _conv_output(conv, x):
    """(output shape of one image, dtype) of ``conv`` on ``x``."""
    if x.ndim != 4:
        raise ValueError(f"x must be 4-D (N, C, H, W) for a Conv2d, got x of shape {x.shape}")
    if conv.accumulate:
        raise ValueError("a Conv2d with accumulate=True adds to an out= array: cso.dask cannot "
                         "map it over chunks")
    # x's own shape in the errors; a batch of unknown size plans as one image
    batch = 1 if np.isnan(x.shape[0]) else x.shape[0]
    return conv.spec_for((batch,) + x.shape[1:], x.dtype).output_shape[1:], conv.dtype


def _model_output(model, x):
    """(output shape of one image, dtype) of ``model`` on ``x``: a run on one image of zeros
    tells them."""
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise TypeError(f"cso.dask.apply maps models with one input and one output; this one "
                        f"has inputs {model.input_names} and outputs {model.output_names}")
    ((name, (shape, dtype)),) = model.inputs.items()
    if x.shape[1:] != shape[1:] or x.dtype != dtype:
        raise ValueError(f"x must have shape (batch, {', '.join(map(str, shape[1:]))}) and dtype "
                         f"{dtype} for the model's input {name!r}, got x of shape {x.shape} and "
                         f"dtype {x.dtype}")
    y = model(np.zeros((1,) + shape[1:], dtype))
    if y.ndim == 0 or y.shape[0] != 1:
        raise ValueError(f"the model's output for one image has shape {y.shape}: it has no "
                         f"batch axis to map over")
    return y.shape[1:], y.dtype


class _Shipped:
    """A layer as the tasks get it: the layer itself in the process that made the graph, else
    its token and pickle, which the registry unpickles once per process."""

    def __init__(self, token, layer=None, payload=None):
        self.token, self.layer, self.payload = token, layer, payload

    def __reduce__(self):
        payload = self.payload if self.layer is None else pickle.dumps(self.layer, protocol=5)
        return _Shipped, (self.token, None, payload)

    def get(self):
        if self.layer is not None:
            return self.layer
        with _registry_lock:   # a layer unpickled once, when several threads need it at once
            layer = _registry.get(self.token)
            if layer is None:
                layer = _registry[self.token] = pickle.loads(self.payload)
                unpickled[self.token] += 1
                while len(_registry) > REGISTRY_SIZE:
                    _registry.popitem(last=False)
            _registry.move_to_end(self.token)
        return layer


def _run(shipped, block):
    threads = _worker_threads()
    if threads is not None:
        set_num_threads(threads)
    return shipped.get()(block)


def _worker_threads():
    """The threads of the ``distributed`` worker running this task, None outside one."""
    distributed = sys.modules.get("distributed")   # a worker process has imported it
    if distributed is None:
        return None
    try:
        return distributed.get_worker().state.nthreads
    except ValueError:   # not in a worker's task
        return None


def token(layer):
    """The token that names ``layer`` in graphs and in the registry counts ``unpickled``."""
    return _tokens.setdefault(layer, uuid.uuid4().hex)

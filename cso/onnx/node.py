"""One ONNX node as the loader and the operators see it: plain Python attributes, NumPy
tensors, and the errors that name the node."""
from dataclasses import dataclass, field
from typing import Any


class UnsupportedModel(ValueError):
    """A node, attribute or input the loader cannot run correctly: raised at load time."""


@dataclass
class Node:
    op_type: str
    name: str
    inputs: list[str]          # '' stands for an omitted optional input
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)   # ints, floats, str, lists, ndarrays
    opset: int = 13            # the model's version of the default ONNX domain

    @classmethod
    def from_proto(cls, proto, opset):
        """A Node of an ``onnx.NodeProto`` (onnx is imported by whoever holds a proto)."""
        from onnx import helper, numpy_helper
        if proto.domain not in ("", "ai.onnx"):
            raise UnsupportedModel(f"ONNX node {proto.name or proto.output[0]!r} "
                                   f"({proto.domain}.{proto.op_type}): operators of domain "
                                   f"{proto.domain!r} are not supported")
        attrs = {}
        for attr in proto.attribute:
            value = helper.get_attribute_value(attr)
            if isinstance(value, bytes):
                value = value.decode()
            elif hasattr(value, "dims"):      # a TensorProto
                value = numpy_helper.to_array(value)
            elif isinstance(value, list):
                value = [v.decode() if isinstance(v, bytes) else v for v in value]
            attrs[attr.name] = value
        return cls(proto.op_type, proto.name or proto.output[0], list(proto.input),
                   list(proto.output), attrs, opset)

    def error(self, what):
        """An UnsupportedModel naming this node: ``raise node.error("...")``."""
        return UnsupportedModel(f"ONNX node {self.name!r} ({self.op_type}): {what}")

    def attr(self, name, default=None):
        return self.attrs.get(name, default)

    def only(self, *names):
        """Raise if the node has an attribute outside ``names`` (one this operator ignores
        would change the answer)."""
        unknown = sorted(set(self.attrs) - set(names))
        if unknown:
            raise self.error(f"attribute(s) {unknown} not supported (supported: {sorted(names)})")

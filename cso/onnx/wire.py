"""An ONNX file read without the weights it holds inline.

``onnx.load`` reads the whole file into bytes and parses them into a proto that copies every
initializer's ``raw_data``: AlexNet's 233 MiB of weights were held twice at once, its load's
peak. Here the file's protobuf wire format is walked instead (``ModelProto.graph``, field 7;
``GraphProto.initializer``, field 5; ``TensorProto.raw_data``, field 9), and each initializer
with more than ``INLINE_BYTES`` of raw data is rewritten as external data at its offset in the
file itself, which ``graph.external_array`` reads straight into an array. The rest of the file,
nodes and small tensors, is parsed as it is.
"""
import mmap

INLINE_BYTES = 1024   # raw data smaller than this stays in the proto

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_GRAPH, _INITIALIZER, _RAW_DATA, _EXTERNAL_DATA, _DATA_LOCATION = 7, 5, 9, 13, 14
_EXTERNAL = 1   # TensorProto.DataLocation.EXTERNAL


class WireError(ValueError):
    """The file is not protobuf wire format this reader walks (onnx.load then reads it)."""


def model_bytes(path, location):
    """The bytes of the ModelProto in file ``path`` with its initializers' raw data larger than
    ``INLINE_BYTES`` moved out as external data in file ``location`` (``path``'s name, beside
    the model) at their offsets. Raises ``WireError`` on anything it does not walk."""
    with open(path, "rb") as f:
        if not f.seek(0, 2):
            return b""
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            def tensor(start, stop):
                return _tensor(data, start, stop, location)

            def graph(start, stop):
                return _message(data, start, stop, {_INITIALIZER: tensor})
            return _message(data, 0, len(data), {_GRAPH: graph})


def _message(data, start, stop, rewrite):
    """The bytes of the message in ``data[start:stop]``, its length-delimited fields whose
    numbers ``rewrite`` names rewritten (number -> function of the span of the field's
    value)."""
    return b"".join(_field(number, rewrite[number](first, end))
                    if kind == _LEN and number in rewrite else data[at:end]
                    for number, kind, at, first, end in _spans(data, start, stop))


def _spans(data, start, stop):
    """(number, wire type, first byte, first byte of its value, end) of each field of the
    message in ``data[start:stop]``."""
    at = start
    while at < stop:
        key, first = _varint(data, at)
        number, kind = key >> 3, key & 7
        if kind == _VARINT:
            end = _varint(data, first)[1]
        elif kind == _I64:
            end = first + 8
        elif kind == _I32:
            end = first + 4
        elif kind == _LEN:
            size, first = _varint(data, first)
            end = first + size
        else:
            raise WireError(f"wire type {kind} at byte {at}")
        if end > stop:
            raise WireError(f"field {number} at byte {at} runs past its message")
        yield number, kind, at, first, end
        at = end


def _tensor(data, start, stop, location):
    """A TensorProto's bytes, its raw data, if large, moved out as external data."""
    spans = list(_spans(data, start, stop))
    raw = [(first, end) for number, kind, _, first, end in spans
           if number == _RAW_DATA and kind == _LEN]
    if not raw or raw[-1][1] - raw[-1][0] <= INLINE_BYTES:
        return data[start:stop]
    (first, end), = raw[-1:]
    kept = [data[at:stop_] for number, kind, at, _, stop_ in spans
            if not (number == _RAW_DATA and kind == _LEN)]
    entries = (("location", location), ("offset", str(first)), ("length", str(end - first)))
    kept += [_field(_EXTERNAL_DATA, _field(1, key.encode()) + _field(2, value.encode()))
             for key, value in entries]
    kept.append(_encode_varint(_DATA_LOCATION << 3 | _VARINT) + _encode_varint(_EXTERNAL))
    return b"".join(kept)


def _field(number, body):
    """A length-delimited field's bytes."""
    return _encode_varint(number << 3 | _LEN) + _encode_varint(len(body)) + body


def _varint(data, at):
    """(value, the byte after it) of the varint at ``at``."""
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise WireError(f"a varint runs past byte {at}")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7


def _encode_varint(value):
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)

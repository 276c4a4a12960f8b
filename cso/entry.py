"""The C entry every call runs its parts through: ``void run_part(int64 *args, int64 part)``.

A loop nest (``lowering``, ``depthwise``) is generated as this entry (``microkernels.loop_ir``):
``args`` is one vector of int64 words laid out as ``CALL_ARGS``, written by
``prepared.Prepared.run`` and shared by the call's parts; ``part`` picks the part's row of
``parts`` and of each workspace. The loop nest's ``geom`` vector is read by field name.
"""
import numpy as np

from microkernels.loop_ir import LoopCode

from .pool import PART_FN

# a call's arguments, one int64 word each: the arrays' addresses, the input's shape and the
# output's channels, the workspaces' with a part's row length in elements (``*_row``)
CALL_ARGS = ("x", "n", "c", "h", "w", "weights", "bias", "out", "out_k", "geom", "parts",
             "scratch", "scratch_row", "out_t", "out_t_row", "rows", "rows_row")
PART_WORDS = 4   # a ``parts`` row: first window tile (unit), end, first filter tile (of all groups'), end


ENTRY_WORD = len(CALL_ARGS)   # ``call_on_arrays``: the entry's address, after the arguments


def define_call_on_arrays(module, data_offset):
    """``void call_on_arrays(int64 *args)``: ``args`` as ``CALL_ARGS`` but with the NumPy
    array objects' addresses (``id``) for "x" and "out", and an entry's address in word
    ``ENTRY_WORD``: the two words set to the arrays' data addresses (``data_offset`` bytes
    into the object, ``microkernels.aligned.DATA_OFFSET``), then part 0 of the entry. A
    one-part call in one ctypes call of one argument, its address reads done here: each
    argument and address read in Python costs a quarter of a microsecond, of a small
    layer's few."""
    code = LoopCode(module, "call_on_arrays", ("args",), pointer_args=("args",))
    args = code.arg("args")
    for name in ("x", "out"):
        at = CALL_ARGS.index(name)
        code.store(args, at, code.load(code.load(args, at) + data_offset, 0))
    code.call((code.load(args, ENTRY_WORD), PART_FN), args, 0)
    code.ret()
    return code.function


class Geom:
    """The named int64 fields of a loop nest's ``geom`` vector, the one place their order is
    fixed: ``pack`` writes the vector by name, ``EntryCode.geom`` reads it by name."""

    def __init__(self, *fields):
        if len(set(fields)) != len(fields):
            raise ValueError(f"geom fields repeat: {fields}")
        self.fields = fields

    def index(self, name):
        return self.fields.index(name)

    def pack(self, **values):
        """The vector of ``values``, one per field (ValueError naming the fields missing or
        unknown; OverflowError for a value int64 cannot hold)."""
        missing, unknown = set(self.fields) - set(values), set(values) - set(self.fields)
        if missing or unknown:
            raise ValueError(f"geom: missing fields {sorted(missing)}, unknown {sorted(unknown)}")
        return np.array([int(values[f]) for f in self.fields], dtype=np.int64)


class EntryCode(LoopCode):
    """The C entry ``name`` being generated: ``call_arg``, ``geom`` (the fields of ``layout``,
    a ``Geom``, by name), ``part_field`` and ``workspace`` read the call's arguments, once, at
    the entry."""

    def __init__(self, module, name, layout):
        super().__init__(module, name, ("args", "part"), pointer_args=("args",))
        geom = self.call_arg("geom")
        self._geom = {f: self.load(geom, i) for i, f in enumerate(layout.fields)}

    def call_arg(self, name):
        return self.load(self.arg("args"), CALL_ARGS.index(name))

    def geom(self, *names):
        """The ``geom`` fields ``names``: one value, or a list."""
        values = [self._geom[n] for n in names]
        return values[0] if len(names) == 1 else values

    def part_field(self, index):
        """Word ``index`` of this part's row of ``parts``."""
        return self.load(self.call_arg("parts"), self.arg("part") * PART_WORDS + index)

    def workspace(self, name, itemsize):
        """The address of this part's row of workspace ``name``."""
        return self.call_arg(name) + self.arg("part") * self.call_arg(name + "_row") * itemsize

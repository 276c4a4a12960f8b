"""Public API: ``conv2d`` (one call) and ``Conv2d`` (filters packed once, run many times).

Semantics are PyTorch's ``torch.nn.functional.conv2d``: cross-correlation, NCHW input, OIHW
weights, zero padding, output in the input's dtype.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import NamedTuple, Optional, Union

import numpy as np

import csa
from microkernels import ACCUMULATE, ACTIVATE, BIAS, DepthwiseSpec, KernelSpec
from microkernels.aligned import LINE, aligned_empty
from microkernels.once import fork_safe_lock
from packing import merge_groups, pack_filters, repack_filters, unpack_filters

from . import arguments as args
from . import autotune
from . import host
from .activations import Activation
from .buffers import LARGE_OUTPUT_BYTES, large_outputs
from .layouts import (Blocked, block_size, check_layout, check_out, from_nchw, input_layout,
                      merged, merged_on_blocks, reads_blocks, runs_padded_merge,
                      to_nchw, written)
from .loop_nests import ALL_PHASES
from .prepared import Prepared
from .threads import get_num_threads

IntPair = Union[int, tuple[int, int]]
# an int, (h, w), ((top, bottom), (left, right)), 'valid' or 'same'
Padding = Union[int, tuple[int, int], tuple[tuple[int, int], tuple[int, int]], str]
Plan = Union[csa.SlicingPlan, csa.DepthwisePlan]
Shape = tuple[int, ...]
ActivationArg = Union[None, str, Activation]   # see ``Activation.of``

PREPARED_SHAPES = 64  # input shapes a Conv2d keeps prepared
_tables = fork_safe_lock()   # guards every Conv2d's tables of packed filters and prepared shapes


class Conv2d:
    """A convolution with fixed weights: validates and packs ``weight`` once, then ``conv(x)``
    runs it on any input with the right channel count. ``activation`` (as ``conv2d``'s) is
    applied as the output is stored: no pass of its own over the output. ``input_shape``, when
    the input size is known at load time, packs the filters for that shape's plan (with
    ``input_layout="blocked"``, its blocked plan, for calls on blocked values), else for the
    usual orientation; another orientation repacks once on first use. ``plan_overrides`` forces CSA
    choices (``csa.OVERRIDES``: ``vectors_along`` 'windows'/'filters', ``microtile_shape``,
    ``nc``, ``k2``, ``k3``, ``schedule`` 'IS'/'WS', ``slab`` True/False, ``band`` window tiles
    per output band, ``split``; a depthwise plan's ``block_vectors``, ``nc``, ``band``,
    ``split``; ``depthwise`` False) and ``isa`` picks a micro-kernel ISA other than the host's best; both exist for tests and
    experiments. ``accumulate=True`` makes every call add to ``out`` (which it then requires):
    ``out = act(out + conv(x) + bias)``, a residual connection fused into the store (not for
    depthwise plans). ``tune=True`` times CSA's best-ranked plans for each new input shape (and
    thread count) and runs the fastest (``cso.autotune``: about a second per shape, once per
    machine). Everything compiled and tuned is kept in the persistent cache (``CSO_CACHE_DIR``,
    see ``microkernels.cache``): a later process loads it. A Conv2d pickles and deep-copies as
    its filters, bias and arguments: the copy packs and prepares itself again when loaded
    (``cso.dask`` ships layers to other processes this way). ``channel_shuffle=g`` (a
    depthwise convolution only) reads the input's channels in the order of ShuffleNet's
    channel shuffle of ``g`` groups, without the copy: ``conv(x)`` is the convolution of
    ``x.reshape(N, g, C // g, H, W).transpose(0, 2, 1, 3, 4).reshape(N, C, H, W)``."""

    def __init__(self, weight: np.ndarray, bias: Optional[np.ndarray] = None,
                 stride: IntPair = 1, padding: Padding = 0, dilation: IntPair = 1,
                 groups: int = 1, activation: ActivationArg = None, *,
                 input_shape: Optional[Shape] = None, plan_overrides: Optional[dict] = None,
                 isa: Optional[str] = None, tune: bool = False, accumulate: bool = False,
                 channel_shuffle: int = 1, input_layout: str = "nchw") -> None:
        for name, value in (("tune", tune), ("accumulate", accumulate)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        self.accumulate = accumulate
        if tune and plan_overrides:
            raise ValueError(f"tune=True chooses the plan by timing; it cannot take "
                             f"plan_overrides {plan_overrides} as well")
        self.tune = tune
        self.groups = args.check_weight(weight, bias, groups)
        self.channel_shuffle = args.check_channel_shuffle(channel_shuffle, weight.shape,
                                                          self.groups)
        self.stride = args.pair("stride", stride, 1)
        self.dilation = args.pair("dilation", dilation, 1)
        self.padding = args.padding_rule(padding)
        self.activation = _store_activation(activation)
        self.isa = host.check_isa(isa)
        try:
            depthwise, overrides = csa.check_overrides(weight.shape[1], **(plan_overrides or {}))
        except (TypeError, ValueError) as err:
            raise type(err)(f"plan_overrides: {err}") from None
        self.overrides = tuple(sorted(overrides.items()))
        self.dtype = weight.dtype
        self.weight_shape = weight.shape
        self.bias = np.empty(0, self.dtype) if bias is None else np.array(bias, copy=True)
        self._by_shape = {}
        self._routes = {}
        self._on_blocks = {}   # (shape, threads) -> ``_nchw_on_blocks``
        # (shape, dtype, threads, layout: None, "nhwc", or a Blocked's channels) -> the plain
        # call of such inputs (__call__)
        self._plain = {}
        self._padded_bias = None
        self._merged_twin = None   # (``_merged``)
        self._merged_filters = False   # whether this is such a twin (``_merged``)
        # what a copy is built from besides the filters and bias (pickling, ``copy.deepcopy``)
        self._arguments = dict(
            stride=self.stride, dilation=self.dilation, groups=self.groups,
            padding=self.padding if self.padding == "same" else (self.padding[:2],
                                                                  self.padding[2:]),
            activation=self.activation, input_shape=None if input_shape is None
            else tuple(input_shape), plan_overrides=dict(plan_overrides or {}), isa=isa,
            tune=tune, accumulate=accumulate, channel_shuffle=channel_shuffle)
        if input_layout not in ("nchw", "blocked"):
            raise ValueError(f"input_layout must be 'nchw' or 'blocked', got {input_layout!r}")
        self._arguments["input_layout"] = input_layout
        if input_shape is None:
            nf = csa.filters_per_tile(host.host_machine(self.isa), self.dtype.itemsize, depthwise)
        else:   # compile (or load) now what calls on that shape run
            threads = get_num_threads()
            plan = None
            if input_layout == "blocked":   # (the blocked plan's filter tile, where it has one)
                plan = self._blocked_plan(self.spec_for(tuple(input_shape)),
                                          block_size(self.dtype, self.isa), threads)[0]
            if plan is None:
                prepared = self._prepared(tuple(input_shape), self.dtype, threads)
                prepared.warm(threads)
                plan = prepared.plan
            nf = plan.nf
        self._packed = {nf: pack_filters(weight, nf, self.groups)}

    @property
    def nbytes(self) -> int:
        """Bytes of what this layer holds from call to call: its filters in each packing its
        plans read (one per filter tile size), those of its groups merged onto blocks
        (``_merged``), and its bias. (Not its workspaces: each thread keeps its own, shared by
        every layer it runs, ``cso.jobs.workspace``.)"""
        with _tables:
            packed = sum(weights.nbytes for weights in self._packed.values())
        twin = self._merged_twin
        return packed + self.bias.nbytes + (0 if twin is None else twin.nbytes)

    def packed_weight(self, nf: int) -> np.ndarray:
        """The filters packed in tiles of ``nf`` (packed once per tile size)."""
        found = self._packed.get(nf)
        if found is None:
            with _tables:
                any_packed = next(iter(self._packed.values()))
            found = repack_filters(any_packed, self.weight_shape[0], nf, self.groups)
            with _tables:
                found = self._packed.setdefault(nf, found)
        return found

    def spec_for(self, shape: Shape, dtype: Optional[np.dtype] = None) -> csa.ConvSpec:
        """The ConvSpec of an input of ``shape`` (N, C, H, W) or (C, H, W)."""
        return args.conv_spec(shape, np.dtype(dtype or self.dtype), self.weight_shape, self.dtype,
                              self.stride, self.padding, self.dilation, self.groups)

    def plan_for(self, shape: Shape) -> Plan:
        """The plan (``csa.SlicingPlan``, or ``csa.DepthwisePlan`` for one input channel per
        group) that runs inputs of ``shape`` (N, C, H, W) or (C, H, W)."""
        return self._running(tuple(shape)).plan

    def _running(self, shape):
        """The ``Prepared`` an NCHW call on ``shape`` runs: the NCHW plan's, or the blocked
        plan's where the call runs on blocks (``_nchw_on_blocks``)."""
        threads = get_num_threads()
        on_blocks = self._nchw_on_blocks(shape, threads)
        if on_blocks is not None:
            return on_blocks._route(self._twin_shape(on_blocks, shape), "nchw", 1, "nchw",
                                    threads).prepared
        return self._prepared(shape, self.dtype, threads)

    def _nchw_on_blocks(self, shape, threads):
        """The ``Conv2d`` whose blocked plan runs NCHW calls on ``shape`` (reading the
        planes and writing them), or None (the NCHW plan runs them): this one
        (``_grouped_on_blocks``), or the one of its groups merged onto blocks
        (``_merged``) where that one's groups are one block each: groups of 4 and 8 channels
        1.2x at 1 thread, 1.5-1.7x at 2 (csa/TUNING.md, "Groups merged onto blocks"); a
        merge padded with a zero group too (``_call_padded_planes``)."""
        if len(shape) != 4 or self.groups == 1 or self.tune or self.overrides:
            return None
        key = (shape, threads)
        if key in self._on_blocks:
            return self._on_blocks[key]
        plan = self._plan_for(self.spec_for(shape), threads)
        found = self if self._grouped_on_blocks(plan) else None
        if found is None:
            twin = self._merged(plan.spec)
            twin_plan = twin and twin._plan_for(twin.spec_for(self._twin_shape(twin, shape)),
                                                threads)
            # a merge padded with a zero group runs on the planes' slab, its fills bounded by
            # the call's channels: where its blocked plan reads the input in place (no
            # padding), the zero group's channels would be read past the input's end, and a
            # zero filter times a NaN there is NaN
            if twin is not None and (not self._padded_merge(twin) or (
                    runs_padded_merge(plan.spec, self.isa)
                    and not csa.layout.reads_in_place(twin_plan.spec))) and \
                    twin._grouped_on_blocks(twin_plan, merged=True):
                found = twin
        _remember(self._on_blocks, key, found)
        return found

    def _prepared(self, shape, dtype, threads, blocks=None):
        """Everything a call on ``shape`` with up to ``threads`` threads needs that does not
        depend on the data, computed once per shape and thread count (a small FIFO-bounded
        table: a stream of new shapes cannot grow it); with ``blocks`` (input, output channels
        a block), the blocked plan's."""
        key = (shape, dtype, threads, blocks)
        found = self._by_shape.get(key)
        if found is None:
            spec = self.spec_for(shape, dtype)
            flags = ((BIAS if self.bias.size else 0) | (ACTIVATE if self.activation else 0)
                     | (ACCUMULATE if self.accumulate else 0))
            try:
                plan = self._plan_for(spec, threads, self._plan_layout(blocks, spec))
                if blocks is None and self._depthwise_on_blocks(plan):
                    plan, blocks = self._plan_for(spec, threads, "blocked"), (1, 1)
                if self.accumulate and isinstance(plan, csa.DepthwisePlan):
                    raise ValueError(f"accumulate=True is not supported by depthwise plans "
                                     f"(weight {self.weight_shape}, groups={self.groups}, input "
                                     f"of shape {shape})")
                if self.channel_shuffle > 1 and not isinstance(plan, csa.DepthwisePlan):
                    raise ValueError(f"channel_shuffle={self.channel_shuffle} needs a "
                                     f"depthwise plan (weight {self.weight_shape}, "
                                     f"groups={self.groups}, input of shape {shape})")
                found = Prepared(plan, flags, self.isa, self.channel_shuffle, self.activation,
                                 blocks, self._merged_filters)
            except ValueError as err:   # an override this shape or kernel cannot take
                if not self.overrides:
                    raise
                raise ValueError(f"plan_overrides {dict(self.overrides)} for input of shape "
                                 f"{shape}: {err}") from None
            _remember(self._by_shape, key, found)
        return found

    def _plan_layout(self, blocks, spec):
        """The layout ``csa.analyze`` plans a call for that reads and writes ``blocks`` (input,
        output channels a block; None: NCHW): "nhwc" where either side is channels last (all
        the channels a block, more than the kernels' lanes), else "blocked"."""
        if blocks is None:
            return "nchw"
        lanes = block_size(self.dtype, self.isa)
        channels_last = any(block == channels != lanes for block, channels in
                            zip(blocks, (spec.c, spec.k)))
        return "nhwc" if channels_last else "blocked"

    def _depthwise_on_blocks(self, plan):
        """Whether an NCHW call runs depthwise ``plan`` (the NCHW one, not forced by
        overrides) as the blocked plan on NCHW planes (``cso.depthwise``: each band's planes
        transposed into a slab of blocks, each output row's blocks back into the planes): a
        vector of channels a tap for every window, where the NCHW kernel's vectors run along
        the rows, padding columns included. Filters of at least
        ``tuning.depthwise_blocked_min_taps`` taps only, where their FMAs pay for the
        transposes: on AVX2 a 7x7's, not a 3x3's; on AVX-512, whose vectors hold more of a
        short or strided row's padding, every filter but a 1x1 (csa/TUNING.md, "Depthwise on
        NCHW through blocks")."""
        least = plan.machine.tuning.depthwise_blocked_min_taps if isinstance(
            plan, csa.DepthwisePlan) else 0
        return (0 < least <= plan.spec.r * plan.spec.s and self.channel_shuffle == 1
                and not self.accumulate and not self.overrides
                and csa.layout.blocked_fits(plan.spec, block_size(self.dtype, self.isa)))

    def _grouped_on_blocks(self, plan, merged=False):
        """Whether an NCHW call runs grouped ``plan``'s convolution (the NCHW plan's, neither
        forced by overrides nor tuned) on its blocked plan, which transposes the NCHW planes
        into its slab's blocks and writes the planes from each band: as many filters as
        channels a group, a whole number of blocks up to
        ``tuning.grouped_blocked_max_blocks``, a filter larger than 1x1, an output plane of
        at most ``tuning.grouped_blocked_max_plane`` pixels, or, for groups of their own (not
        ``merged`` ones, whose zero filters add FMAs), an input plane of at most
        ``tuning.grouped_blocked_max_input``. There the NCHW plan's window tiles are few and
        short for each group's few filters, where the blocked kernels' vectors hold a group's
        channels whole: 1.15-1.46x on such timm convolutions with the output's blocks
        reordered after the call (csa/TUNING.md, "Grouped convolutions on blocks"), which
        writing the planes from each band made 1.01-1.45x faster; a 1x1's FMAs do not pay for
        the input's transposes."""
        spec, tuning = plan.spec, plan.machine.tuning
        if not (isinstance(plan, csa.SlicingPlan) and spec.groups > 1 and spec.r * spec.s > 1
                and (spec.p * spec.q <= tuning.grouped_blocked_max_plane
                     or not merged and spec.h * spec.w <= tuning.grouped_blocked_max_input)):
            return False   # (most calls: decided without the lanes)
        lanes = block_size(self.dtype, self.isa)
        blocks, rest = divmod(spec.c_per_group, lanes)
        return (spec.c_per_group == spec.k_per_group and not rest
                and blocks <= tuning.grouped_blocked_max_blocks and self.channel_shuffle == 1
                and not self.overrides and not self.tune and csa.layout.blocked_fits(spec, lanes))

    def _merged(self, spec):
        """The ``Conv2d`` of this convolution with its groups merged onto blocks
        (``csa.layout.merged_groups``: 8 channels a group on blocks of 16, two groups a block,
        ``packing.merge_groups``: its kernels mask each filter's FMAs off the other groups'
        channels, ``KernelSpec.merged``), which runs its blocked and channels-last
        calls, and some NCHW ones (``_nchw_on_blocks``); or None. For grouped ``spec``s whose
        groups do not start on blocks, a filter larger than 1x1, an output plane of at most
        ``tuning.merged_groups_max_plane`` pixels (``cso.layouts.merged_on_blocks``): there
        the blocked kernels on whole blocks, zeros included, outrun the NCHW plan with its
        input and output reordered, 1.2-5x (csa/TUNING.md, "Groups merged onto blocks").
        Made at the first such call: its packed filters are m times this one's. Where the
        last merge is padded with zero groups (``csa.layout.padded_groups``), it has more
        channels and filters (``_padded_merge``): the padding lanes of this one's blocks."""
        if self.tune or self.overrides or self.channel_shuffle > 1:
            return None
        m = merged_on_blocks(spec, self.isa)
        if m == 1:
            return None
        if self._merged_twin is None:
            with _tables:
                any_packed = next(iter(self._packed.values()))
            weight, bias = unpack_filters(any_packed, self.weight_shape[0]), self.bias
            zero_filters = csa.layout.padded_groups(spec, m) * spec.k_per_group
            if zero_filters:
                weight = np.concatenate([weight, np.zeros((zero_filters,) + weight.shape[1:],
                                                          self.dtype)])
                bias = np.concatenate([bias, np.zeros(zero_filters, self.dtype)]) if bias.size \
                    else bias
            groups = weight.shape[0] // spec.k_per_group
            twin = Conv2d(merge_groups(weight, groups, m), bias if bias.size else None,
                          **dict(self._arguments, groups=groups // m, input_shape=None,
                                 input_layout="nchw"))
            twin._merged_filters = True
            if not zero_filters:   # (either one's calls compute this convolution)
                twin._plain = self._plain
            with _tables:
                if self._merged_twin is None:
                    self._merged_twin = twin
        return self._merged_twin

    def _twin_shape(self, twin, shape):
        """The NCHW ``shape`` of this one's input as ``twin`` (this one, or its groups merged:
        ``_merged``) sees it: with its zero groups' channels where it has them."""
        if twin is self or not self._padded_merge(twin):
            return shape
        return (shape[0], twin.weight_shape[1] * twin.groups) + tuple(shape[2:])

    def _padded_merge(self, twin):
        """Whether ``twin`` (``_merged``) has zero groups past this one's: it runs calls on
        blocks of its lanes, whose padding lanes are its extra channels (the input copied into
        such blocks for channels-last calls: ``runs_padded_merge``), and NCHW calls on their
        planes, which have no such channels (``_call_padded_planes``)."""
        return twin.weight_shape[0] != self.weight_shape[0]

    def _call_padded_merge(self, twin, xb, out, phases, out_layout="blocked"):
        """A call (``_call_blocked``) of the Blocked ``xb`` (blocks of any size: channels last
        is one block of all channels) run by ``twin``, whose zero groups read and write the
        padding lanes of the last blocks of the kernels' lanes (finite values, read into no
        result): the same blocks seen with its channels, ``xb`` copied into such blocks
        first where its own are others, the output moved into ``out_layout`` after. The
        plain calls of blocks of the lanes in and out are this one's, on the channels seen
        as these."""
        c, k = twin.weight_shape[1] * twin.groups, twin.weight_shape[0]
        lanes = block_size(self.dtype, self.isa)
        in_place = out is not None and out_layout == "blocked"   # (of the lanes: check_out)
        acc = out if in_place else None
        if out is not None and not in_place and self.accumulate:
            acc = Blocked.from_nchw(to_nchw(out, out_layout), lanes)
        on_lanes = xb.block == lanes
        xb = xb.reblocked(lanes)
        result = twin._call_blocked(Blocked.made(xb.data, c), None if acc is None else
                                    Blocked.made(acc.data, k), phases, "blocked", "blocked")
        if in_place:
            return out
        result = Blocked.made(result.data, self.weight_shape[0])
        if out_layout != "blocked":
            return written(result.to_nhwc() if out_layout == "nhwc" else result.to_nchw(), out)
        key = (xb.data.shape, xb.dtype, get_num_threads())
        plain = twin._plain.get(key + (c,))
        if plain is not None and on_lanes and phases == ALL_PHASES:
            _remember(self._plain, key + (xb.channels,), _padded_plain_call(
                plain, c, self.weight_shape[0]))
        return result

    def _operands(self, plan, out_block=1):
        """(the filters, the bias) as ``plan`` reads them: a blocked depthwise plan's weight
        vectors, else the packed filters; the bias over the output's channels in blocks of
        ``out_block`` (1: NCHW, K: channels last), the last block padded with zeros (a
        blocked depthwise plan's kernel reads a vector of it a block, whatever the output)."""
        if isinstance(plan, csa.DepthwisePlan) and plan.blocked:
            weights, out_block = self._blocked_depthwise_weight(plan.lanes), plan.lanes
        else:
            weights = self.packed_weight(plan.nf)
        return weights, self._bias_for(-(-plan.spec.k // out_block) * out_block)

    def _plan_for(self, spec, threads, layout="nchw"):
        if not self.tune or layout != "nchw":   # (autotuning times NCHW plans)
            return host.plan(spec, self.isa, self.overrides, threads, layout)
        record = autotune.tuned(spec, self.isa, threads)
        _, given = csa.check_overrides(spec.c_per_group, **record["overrides"])
        overrides = tuple(sorted(given.items()))
        return autotune.tuned_plan(host.plan(spec, self.isa, overrides, threads), record)

    def __call__(self, x: Union[np.ndarray, Blocked], out: Union[np.ndarray, Blocked, None] = None,
                 *, layout: Optional[str] = None,
                 out_layout: Optional[str] = None) -> Union[np.ndarray, Blocked]:
        """The convolution of ``x``: an NCHW array, an NHWC one (``layout="nhwc"``) or a
        ``cso.Blocked``. The result is laid out as ``out_layout`` says ("nchw", "nhwc" or
        "blocked"; default: as ``x``), in ``out`` when given (an array of that layout, or a
        ``Blocked`` of the kernels' block, ``cso.layouts.block_size``). Blocked and NHWC
        values run on blocked plans (``csa.analyze(..., layout="blocked")``) where the
        convolution takes them (``csa.layout.blocked_fits``), else on the NCHW plan with
        reorders around it."""
        if out is None and out_layout is None:
            # an NCHW or channels-last array, or a Blocked, of a shape called before: its
            # checks and choices were made then
            if type(x) is np.ndarray:
                plain = self._plain.get((x.shape, x.dtype, get_num_threads(), layout))
                if plain is not None and x.flags.c_contiguous:
                    return plain(x)
            elif type(x) is Blocked and layout is None:
                plain = self._plain.get((x.data.shape, x.dtype, get_num_threads(), x.channels))
                if plain is not None:
                    return plain(x)
        return self._call(x, out, ALL_PHASES, layout, out_layout)

    def bound(self, shape: Shape):
        """``run(x, out)``: ``self(x, out=out)`` with the shape work done here, once, for
        C-contiguous arrays of exactly ``shape`` (N, C, H, W) and its output shape, in the
        filters' dtype, on the current thread count (``.out_shape`` says it): an integration
        that runs the same shapes call after call (``cso.onnx``) skips most of a call's
        Python. Other arrays, or ``out`` overlapping ``x``, take the checked call."""
        shape = tuple(shape)
        threads = get_num_threads()
        prepared = self._prepared(shape, self.dtype, threads)
        packed_w, bias = self._operands(prepared.plan)
        out_shape, dtype = (shape[0],) + prepared.image_output_shape, self.dtype
        run_prepared = prepared.runner(packed_w, bias, threads)

        def run(x, out):
            if (type(x) is not np.ndarray or type(out) is not np.ndarray
                    or x.shape != shape or out.shape != out_shape or x.dtype != dtype
                    or out.dtype != dtype or not x.flags.c_contiguous
                    or not out.flags.c_contiguous or not out.flags.writeable
                    or np.may_share_memory(x, out) or not shape[0]):
                return self(x, out=out)
            run_prepared(x, out)
            return out
        run.out_shape = out_shape
        return run

    def bound_blocked(self, shape: Shape, in_block: int):
        """``run(x, out)`` as ``bound`` on the data of channel-blocked values: for inputs of
        ``shape`` (N, C, H, W) held as ``in_block`` channels a block (1: an NCHW array; else
        a ``Blocked``'s ``data``), writing ``out``, a ``Blocked``'s data of the kernels'
        block (``.out_shape``; ``cso.onnx`` keeps values so between layers). ValueError
        where the convolution has no blocked plan (``csa.layout.blocked_fits``) or cannot
        read such blocks; other arrays than those shapes take the checked call."""
        shape = tuple(shape)
        threads, lanes = get_num_threads(), block_size(self.dtype, self.isa)
        spec = self.spec_for(shape)
        plan, rows = self._blocked_plan(spec, lanes, threads)
        if plan is None:
            twin = self._merged(spec)
            # (a padded merge reads the same blocks, seen with its channels)
            if twin is not None and (in_block == lanes or not self._padded_merge(twin)):
                return twin.bound_blocked((shape[0], twin.weight_shape[1] * twin.groups)
                                          + shape[2:], in_block)
        if plan is None or not reads_blocks(plan, in_block):
            raise ValueError(f"{spec} has no blocked plan reading blocks of {in_block} "
                             f"channels (blocks of {lanes}, groups {self.groups})")
        prepared = self._prepared(merged(shape, rows), self.dtype, threads, (in_block, lanes))
        weights, bias = self._operands(plan, lanes)
        n, k, p, q = (shape[0],) + spec.output_shape[1:]
        in_shape = shape if in_block == 1 else (n, -(-shape[1] // in_block)) + shape[2:] + (
            in_block,)
        out_shape, dtype = (n, -(-k // lanes), p, q, lanes), self.dtype
        run_prepared = prepared.runner(weights, bias, threads)
        # the arrays as the plan sees them (a 1x1's rows merged: views)
        x_view, out_view = merged(in_shape, rows), merged(out_shape, rows)
        merging = rows > 1

        def run(x, out):
            if (type(x) is not np.ndarray or type(out) is not np.ndarray
                    or x.shape != in_shape or out.shape != out_shape or x.dtype != dtype
                    or out.dtype != dtype or not x.flags.c_contiguous
                    or not out.flags.c_contiguous or not out.flags.writeable
                    or np.may_share_memory(x, out) or not n):
                value = x if in_block == 1 else Blocked(x, shape[1])
                return self(value, out=Blocked(out, k), out_layout="blocked").data
            if merging:
                run_prepared(x.reshape(x_view), out.reshape(out_view))
            else:
                run_prepared(x, out)
            return out
        run.out_shape = out_shape
        return run

    def call_phases(self, x: np.ndarray, phases: int) -> np.ndarray:
        """Run only ``phases`` (``cso.loop_nests`` PACK | KERNEL | POST) of the loop nest on ``x``
        and return the output, whose values are then undefined: the benchmark's time breakdown
        times the phases apart this way, on the very tiles a call uses."""
        return self._call(x, None, phases)

    def _call(self, x, out, phases, layout=None, out_layout=None):
        in_layout = input_layout(x, layout)
        out_layout = in_layout if out_layout is None else check_layout("out_layout", out_layout)
        if in_layout != "nchw" or out_layout != "nchw":
            return self._call_blocked(x, out, phases, in_layout, out_layout)
        args.check_array("input", x)
        threads = get_num_threads()
        on_blocks = self._nchw_on_blocks(x.shape, threads) if x.dtype == self.dtype else None
        if on_blocks is not None and self._padded_merge(on_blocks):
            return self._call_padded_planes(on_blocks, x, out, phases, threads)
        if on_blocks is not None:
            result = on_blocks._call_blocked(x, out, phases, "nchw", "nchw")
            route = on_blocks._route(x.shape, "nchw", 1, "nchw", threads)
            if (out is None and phases == ALL_PHASES and type(x) is np.ndarray
                    and x.flags.c_contiguous and not route.reblock):
                _remember(self._plain, (x.shape, x.dtype, threads, None),
                          _plain_on_blocks_call(route, self.dtype))
            return result
        prepared = self._prepared(x.shape, x.dtype, threads)
        batched = x.ndim == 4
        batch = x.shape[0] if batched else 1
        shape = (batch,) + prepared.image_output_shape
        if out is not None:
            args.check_out(out, shape if batched else shape[1:], self.dtype, x)
        elif self.accumulate:
            raise ValueError(f"accumulate=True adds to out: pass out= (an array of shape "
                             f"{shape if batched else shape[1:]})")
        # the kernels write rows at a stride of P*Q: a strided ``out`` goes through a temporary
        direct = out is not None and out.flags.c_contiguous
        if direct:
            result = out if out.ndim == 4 else out.reshape(shape)
        elif self.accumulate:
            result = np.ascontiguousarray(out).reshape(shape)
        else:
            result = _output(shape, self.dtype)
        x4 = x if batched and x.flags.c_contiguous else \
            np.ascontiguousarray(x.reshape((batch,) + x.shape[-3:]))
        if batch:
            operands = self._operands(prepared.plan)
            prepared.run(x4, *operands, result, phases, threads)
            if x4 is x and out is None and phases == ALL_PHASES and type(x) is np.ndarray:
                _remember(self._plain, (x.shape, x.dtype, threads, None),
                          _plain_call(prepared.runner(*operands, threads), shape, self.dtype))
        if out is None:
            return result if batched else result[0]
        if not direct:
            out[...] = result.reshape(out.shape)
        return out

    def _call_padded_planes(self, twin, x, out, phases, threads):
        """An NCHW call (``_nchw_on_blocks``) run by ``twin``, its groups merged onto blocks
        with a zero group after them (``_padded_merge``): its blocked plan on these planes,
        which fills its slab with the input's channels alone (the zero group's lanes zero) and
        writes the output's filters alone from each band (``cso.loop_nests``: the call's C
        and K bound both)."""
        plain = out is None and phases == ALL_PHASES and type(x) is np.ndarray \
            and x.flags.c_contiguous   # (later calls of its shape: a plain call)
        x = np.ascontiguousarray(x)
        route = twin._route(self._twin_shape(twin, x.shape), "nchw", 1, "nchw", threads)
        shape = (x.shape[0], self.weight_shape[0]) + route.out_shape[2:]
        if out is not None:
            args.check_out(out, shape, self.dtype, x)
        elif self.accumulate:
            raise ValueError(f"accumulate=True adds to out: pass out= (an array of shape "
                             f"{shape})")
        in_place = out is not None and out.flags.c_contiguous
        planes = (out if in_place else np.ascontiguousarray(out) if self.accumulate
                  else _output(shape, self.dtype))
        if x.shape[0]:
            route.prepared.run(x, route.weights, route.bias, planes, phases, route.threads)
        if plain:
            _remember(self._plain, (x.shape, x.dtype, threads, None),
                      _plain_on_blocks_call(route, self.dtype, shape))
        return out if in_place else written(planes, out)

    def _one_pixel(self, nhwc_shape):
        """Whether channels-last inputs of ``nhwc_shape`` and their outputs are one pixel
        each, of the filters' channels: held byte for byte as NCHW. Never for groups merged
        onto blocks (``_merged``): their filters' markers need the merged kernels, which only
        the blocked plan runs."""
        n, h, w, c = nhwc_shape
        if (h, w) != (1, 1) or c != self.weight_shape[1] * self.groups or self._merged_filters:
            return False
        return self.spec_for((n, c, 1, 1)).output_shape[2:] == (1, 1)

    def _one_pixel_nhwc(self, x, phases):
        """A channels-last call on one pixel run as the NCHW call it is (a squeeze and
        excitation's 1x1s, whose call is mostly Python: the blocked route's reshaping costs
        more), and later calls of its shape the NCHW ones' plain calls."""
        n, _, _, c = x.shape
        k, threads = self.weight_shape[0], get_num_threads()
        y = self._call(x.reshape(n, c, 1, 1), None, phases).reshape(n, 1, 1, k)
        if phases == ALL_PHASES:
            run = self._pixel_runner(n, c, threads, lambda x, out: (
                x.reshape(n, c, 1, 1), out.reshape(n, k, 1, 1)))
            _remember(self._plain, (x.shape, x.dtype, threads, "nhwc"),
                      _plain_call(run, (n, 1, 1, k), self.dtype, (n, k, 1, 1)))
        return y

    def _one_pixel_blocked(self, xb, phases):
        """A Blocked call on one pixel run as the NCHW call on its data: a pixel's blocks hold
        its channels in order and their padding after them, so that an image's data is its
        NCHW array (one image, or blocks without padding); the output's padding channels are
        zeros. Later calls of its shape run so too. A squeeze and excitation's 1x1s: where no
        blocked plan takes them (384 -> 96 in 4 groups), 35 us through the NCHW route's
        reorders, 5 us so; where one does, its plan's call costs more (1.19x over 17 of
        timm's), unless it runs on more threads than the NCHW plan."""
        n, c, k = xb.data.shape[0], xb.channels, self.weight_shape[0]
        lanes, threads = block_size(self.dtype, self.isa), get_num_threads()
        data_shape, dtype = (n, -(-k // lanes), 1, 1, lanes), self.dtype

        def nchw(data, channels):   # (a C-contiguous view: one image, or no padding)
            return data.reshape(n, -1)[:, :channels].reshape(n, channels, 1, 1)

        data = np.zeros(data_shape, dtype)
        self._call(nchw(xb.data, c), nchw(data, k), phases)
        if phases == ALL_PHASES:
            run = self._pixel_runner(n, c, threads, lambda x, out: (nchw(x, c), nchw(out, k)))

            def call(xb):
                data = np.zeros(data_shape, dtype)
                run(xb.data, data)
                return Blocked.made(data, k)
            _remember(self._plain, (xb.data.shape, dtype, threads, c), call)
        return Blocked.made(data, k)

    def _pixel_runner(self, n, c, threads, planned):
        """The NCHW plan's ``Prepared.runner`` for ``n`` pixels of ``c`` channels, on arrays
        of another layout that ``planned`` views as NCHW (``_one_pixel_nhwc``,
        ``_one_pixel_blocked``)."""
        prepared = self._prepared((n, c, 1, 1), self.dtype, threads)
        return prepared.runner(*self._operands(prepared.plan), threads, planned)

    def _call_blocked(self, x, out, phases, in_layout, out_layout):
        """``_call`` where the input or the output is not NCHW: on a blocked plan, the input
        read as it is (NCHW, channels last, or blocks the kernels can read; other blocks are
        re-blocked) and the output written in the kernels' blocks, or channels last; on the
        blocked plan of the groups merged onto blocks (``_merged``) for groups of part of a
        block; on the NCHW plan with reorders around it for convolutions a blocked plan
        cannot take."""
        if in_layout == "nchw" or in_layout == "nhwc":
            args.check_array("input", x)
            if x.ndim != 4:
                raise ValueError(f"input must be 4-D ({in_layout.upper()}) for out_layout "
                                 f"{out_layout!r}, got shape {x.shape}")
            x = np.ascontiguousarray(x)   # (the kernels read it in place)
            if in_layout == out_layout == "nhwc" and out is None and self._one_pixel(x.shape):
                return self._one_pixel_nhwc(x, phases)
        xb = Blocked.from_nhwc(x) if in_layout == "nhwc" else x
        if xb.dtype != self.dtype:
            raise TypeError(f"input dtype {xb.dtype} differs from weight dtype {self.dtype}; "
                            "mixed dtypes are not supported")
        shape = xb.shape if isinstance(xb, Blocked) else x.shape
        in_block = 1 if in_layout == "nchw" else xb.block
        route = self._route(shape, in_layout, in_block, out_layout, get_num_threads())
        if (in_layout == out_layout == "blocked" and out is None
                and not self.accumulate and (shape[0] == 1 or xb.channels % in_block == 0)
                and self._one_pixel((shape[0], *shape[2:], shape[1]))
                and (route.prepared is None or self._prepared(
                    shape, self.dtype, route.threads).plan.threads
                     >= route.prepared.plan.threads)):
            return self._one_pixel_blocked(xb, phases)
        lanes, out_shape = route.lanes, route.out_shape
        check_out(out, out_layout, out_shape, self.dtype, lanes)
        if out is None and self.accumulate:
            raise ValueError(f"accumulate=True adds to out: pass out= (of shape {out_shape} "
                             f"as NCHW, layout {out_layout!r})")
        if route.merged is not None:
            if self._padded_merge(route.merged):
                return self._call_padded_merge(route.merged, xb, out, phases, out_layout)
            return route.merged._call_blocked(x, out, phases, in_layout, out_layout)
        if route.prepared is None:   # NCHW in between
            acc = to_nchw(out, out_layout) if self.accumulate else None
            result = self._call(to_nchw(xb, in_layout), acc, phases)
            return written(from_nchw(result, out_layout, lanes), out)
        # the key of later calls that can run as this one (``_plain_layout_call``), or None
        plain_key = None
        if (out is None and phases == ALL_PHASES and in_layout == out_layout != "nchw"
                and (in_layout == "nhwc" or not route.reblock)):
            plain_key = ((x.shape, x.dtype, route.threads, "nhwc") if in_layout == "nhwc" else
                         (xb.data.shape, xb.dtype, route.threads, xb.channels))
        if route.reblock:
            xb = Blocked.from_nchw(x, lanes) if in_layout == "nchw" else xb.reblocked(lanes)
            in_layout = "blocked"
        out_block = route.out_block
        if out_layout == "nchw":   # the planes, written by the plan's transposing pass
            in_place = out is not None and out.flags.c_contiguous
            planes = (out if in_place else np.ascontiguousarray(out) if self.accumulate
                      else _output(out_shape, self.dtype))
        elif out_layout == "blocked" and out is not None:
            result = out
        elif out_layout == "nhwc" and out is not None and out_block == out_shape[1]:
            result = Blocked.from_nhwc(out)
        else:
            result = Blocked.empty(out_shape, self.dtype, out_block)
        if shape[0]:
            rows = route.rows
            data = x if in_layout == "nchw" else xb.data
            out_data = planes if out_layout == "nchw" else result.data
            route.prepared.run(data.reshape(merged(data.shape, rows)), route.weights,
                               route.bias, out_data.reshape(merged(out_data.shape, rows)),
                               phases, route.threads)
            if plain_key is not None:
                _remember(self._plain, plain_key, _plain_layout_call(
                    route, plain_key[3] == "nhwc", self.dtype))
        if out_layout == "nchw":
            return out if in_place else written(planes, out)
        if out_layout == "blocked":
            return result
        if out is not None and result.data.base is out:   # channels last, written in place
            return out
        return written(result.to_nhwc(), out)

    def _route(self, shape, in_layout, in_block, out_layout, threads):
        """How calls on an input of ``shape`` (N, C, H, W) in ``in_layout`` (blocks of
        ``in_block`` channels) with an ``out_layout`` output run, decided once per such call
        (a table bounded as ``_prepared``'s): a ``_Route`` whose ``prepared`` is
        the blocked plan's, or None where the convolution runs on the NCHW plan or on that
        of its groups merged onto blocks (``merged``)."""
        key = (shape, in_layout, in_block, out_layout, threads)
        found = self._routes.get(key)
        if found is not None:
            return found
        spec = self.spec_for(shape, self.dtype)   # (checks the shapes)
        lanes = block_size(self.dtype, self.isa)
        out_shape = (shape[0],) + spec.output_shape[1:]
        # (NCHW planes are blocks of one channel: so is a channels-last output of one channel)
        out_block = {"nhwc": spec.k, "nchw": 1}.get(out_layout, lanes)
        plan, rows = self._blocked_plan(spec, lanes, threads,
                                        self._plan_layout((in_block, out_block), spec))
        if plan is None:
            twin = self._merged(spec)
            if twin is not None and self._padded_merge(twin) and not (
                    in_layout == out_layout == "blocked" and in_block == lanes
                    or in_layout != "nchw" and runs_padded_merge(spec, self.isa)):
                twin = None   # (its channels are the padding lanes of blocks of its lanes)
            found = _Route(lanes, out_shape, None, False, lanes, rows, None, None, threads,
                           twin)
        else:
            reblock = not reads_blocks(plan, in_block)
            in_block = lanes if reblock else in_block
            prepared = self._prepared(merged(shape, rows), self.dtype, threads,
                                      (in_block, out_block))
            found = _Route(lanes, out_shape, prepared, reblock, out_block, rows,
                           *self._operands(plan, out_block), threads, None)
        _remember(self._routes, key, found)
        return found

    def _blocked_plan(self, spec, lanes, threads, layout="blocked"):
        """(the blocked plan of ``spec`` on ``layout`` ("blocked", or "nhwc": on channels
        last), the rows of its plane it runs as one: a plain 1x1's,
        ``csa.layout.merged_rows``), or (None, 1) where it has none (groups off the blocks, a
        depthwise convolution of several filters per channel, a channel shuffle, overrides of
        the orientation or the slab, which a blocked plan does not take)."""
        overridden = {name for name, _ in self.overrides} & {"vectors_along", "slab"}
        if (self.channel_shuffle > 1 or overridden
                or not csa.layout.blocked_fits(spec, lanes)):
            return None, 1
        rows = csa.layout.merged_rows(spec)
        plan_spec = self.spec_for(merged(spec.input_shape, rows))
        return self._plan_for(plan_spec, threads, layout), rows

    def _blocked_depthwise_weight(self, lanes):
        """A depthwise convolution's filters for its blocked plan: per block of ``lanes``
        channels, its R*S taps' vectors of weights (zero for the padding channels), starting
        on a cache line as packed filters do (``packing.pack_filters``)."""
        key = ("blocked", lanes)
        found = self._packed.get(key)
        if found is None:
            k, _, r, s = self.weight_shape
            taps = self.packed_weight(1).reshape(k, r * s)   # (a filter a row)
            padded = np.zeros((-(-k // lanes) * lanes, r * s), self.dtype)
            padded[:k] = taps
            found = aligned_empty((len(padded) // lanes, r * s, lanes), self.dtype)
            found[...] = padded.reshape(-1, lanes, r * s).transpose(0, 2, 1)
            with _tables:
                found = self._packed.setdefault(key, found)
        return found

    def _bias_for(self, padded):
        """The bias over a blocked output's ``padded`` channels (zero past K): with one group
        its kernels add a vector of it to each block."""
        if not self.bias.size or padded == self.bias.size:
            return self.bias
        with _tables:
            found = self._padded_bias
            if found is None or found.size != padded:
                found = self._padded_bias = np.zeros(padded, self.dtype)
                found[:self.bias.size] = self.bias
        return found

    def kernel_for(self, shape: Shape) -> Union[KernelSpec, DepthwiseSpec]:
        """The micro-kernel (``KernelSpec``, or ``DepthwiseSpec``) that runs inputs of
        ``shape``."""
        return self._running(tuple(shape)).kernel

    def __reduce__(self):
        # a copy carries the filters, bias and arguments, not what this process made of them
        # (compiled code, locks, packed filters): it packs and prepares again where it is
        # loaded, from the persistent compilation cache. Packing is a permutation, so the
        # filters come back exactly from any packing (none is kept unpacked).
        with _tables:
            any_packed = next(iter(self._packed.values()))
        weight = unpack_filters(any_packed, self.weight_shape[0])
        return _rebuild, (weight, self.bias if self.bias.size else None, self._arguments)

    def __repr__(self):
        return (f"Conv2d(weight {self.weight_shape} {self.dtype}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"activation={self.activation}, isa={self.isa}"
                + (", accumulate=True" if self.accumulate else "")
                + (f", channel_shuffle={self.channel_shuffle}" if self.channel_shuffle > 1
                   else "")
                + (", tune=True)" if self.tune else ")"))


def _remember(table, key, found):
    """``table[key] = found``, the oldest entry dropped from a full table (``PREPARED_SHAPES``:
    a stream of new shapes cannot grow it)."""
    with _tables:  # calls from several threads may miss at once
        if len(table) >= PREPARED_SHAPES:
            del table[next(iter(table))]
        table[key] = found


class _Route(NamedTuple):
    """A ``Conv2d._route``: the kernels' block (``lanes``), the output's NCHW shape, the
    blocked plan's ``Prepared`` (None: the NCHW plan runs, with reorders around it), whether
    the input is re-blocked first, the output's block (1: NCHW planes), the plane's rows run
    as one (a plain 1x1's), the filters and bias as the plan reads them, the thread count,
    and the ``Conv2d`` of the groups merged onto blocks that runs the call instead
    (``_merged``)."""
    lanes: int
    out_shape: tuple
    prepared: Optional[Prepared]
    reblock: bool
    out_block: int
    rows: int
    weights: Optional[np.ndarray]
    bias: Optional[np.ndarray]
    threads: int
    merged: Optional["Conv2d"]


def _plain_call(run, shape, dtype, nchw=None):
    """``call(x)``: a new output of ``shape`` written by ``run`` (a ``Prepared.runner``) from
    ``x``, a C-contiguous array of the shape it was made for (``Conv2d.__call__``); made as
    an NCHW output of shape ``nchw`` would be, where ``shape`` holds the same bytes."""
    new_output = _output_maker(nchw or shape, dtype)

    def call(x):
        result = new_output(shape, dtype)
        run(x, result)
        return result
    return call


def _plain_layout_call(route, nhwc, dtype):
    """``call(x)`` (``Conv2d.__call__``) for a ``Blocked`` or (``nhwc``) a C-contiguous
    channels-last array of the shape ``route`` (a ``_Route`` on a blocked plan, which reads a
    Blocked's blocks as they are) was made for: a new output of the same layout, written by
    its plan (channels last re-blocked first where the plan needs it)."""
    run, rows = route.prepared.runner(route.weights, route.bias, route.threads), route.rows
    n, k, p, q = route.out_shape
    block = route.out_block
    data_shape = (n, -(-k // block), p, q, block)
    new_data = _output_maker(data_shape, dtype)
    out_view = merged(data_shape, rows)

    def call(x):
        if nhwc:   # one block of all its channels (a view), re-blocked where the plan needs
            x = Blocked.made(x.reshape((x.shape[0], 1) + x.shape[1:]), x.shape[3])
            if route.reblock:
                x = x.reblocked(route.lanes)
        data = new_data(data_shape, dtype)
        run(x.data if rows == 1 else x.data.reshape(merged(x.data.shape, rows)),
            data if rows == 1 else data.reshape(out_view))
        return data.reshape(n, p, q, k) if nhwc else Blocked.made(data, k)
    return call


def _plain_on_blocks_call(route, dtype, out_shape=None):
    """``call(x)`` (``Conv2d.__call__``) for a C-contiguous NCHW array of the shape ``route``
    (a ``_Route`` on a blocked plan reading and writing NCHW planes) was made for, where an
    NCHW call runs that plan (``Conv2d._grouped_on_blocks``): a new NCHW output, of
    ``out_shape`` (the route's unless given: a merge padded with a zero group writes fewer
    planes)."""
    return _plain_call(route.prepared.runner(route.weights, route.bias, route.threads),
                       out_shape or route.out_shape, dtype)


def _padded_plain_call(plain, c, k):
    """``call(xb)`` (``Conv2d.__call__``) of a ``Blocked`` run by the plain call ``plain`` of
    a merge padded with zero groups (``Conv2d._call_padded_merge``): its blocks seen with
    ``c`` channels, the output's with ``k``."""
    def call(xb):
        return Blocked.made(plain(Blocked.made(xb.data, c)).data, k)
    return call


def _store_activation(activation):
    """The ``Activation`` a store applies for an ``activation=`` argument, None for none (the
    identity)."""
    activation = Activation.of(activation)
    return None if activation.kind == "identity" else activation


def _rebuild(weight, bias, arguments):
    """A ``Conv2d`` unpickled: built again from what ``Conv2d.__reduce__`` kept."""
    return Conv2d(weight, bias, **arguments)


ALIGNED_OUTPUT_BYTES = 4096   # outputs from a page up start on a cache line


def _output(shape, dtype):
    """An empty output array: from ``ALIGNED_OUTPUT_BYTES`` up on a cache line
    (``microkernels.aligned``: a next layer's kernels may read it in place with vector loads,
    which cross lines every other time from NumPy's 16-byte alignment), smaller ones, and
    those whose images (a channel's plane, or a block's pixels) are shorter than a line,
    where NumPy puts them: aligning one costs 1-2 us a call, more than such a layer's few
    loads lose, and planes shorter than a line start mid-line whatever the array's start
    (a squeeze and excitation's one-pixel outputs). One too large for the address space is
    a MemoryError with its size, like one too large for memory (NumPy says ValueError)."""
    try:
        return _output_maker(shape, dtype)(shape, dtype)
    except ValueError:
        size = np.prod(np.array(shape, dtype=object)) * np.dtype(dtype).itemsize
        raise MemoryError(f"Unable to allocate {size} bytes for an output array with shape "
                          f"{shape} and data type {np.dtype(dtype)}") from None


def _output_maker(shape, dtype):
    """``np.empty``, ``aligned_empty`` or, from ``LARGE_OUTPUT_BYTES`` up, the pool of large
    outputs (``cso.buffers.large_outputs``: the memory of a dropped output, not pages the OS
    zeroes again): what makes an output of ``shape`` (see ``_output``; a plain call picks it
    once, for a shape allocated before)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= LARGE_OUTPUT_BYTES:
        return large_outputs.get
    aligned = nbytes >= ALIGNED_OUTPUT_BYTES and math.prod(shape[2:]) * dtype.itemsize >= LINE
    return aligned_empty if aligned else np.empty


def conv2d(x: np.ndarray, weight: np.ndarray, bias: Optional[np.ndarray] = None,
           stride: IntPair = 1, padding: Padding = 0, dilation: IntPair = 1, groups: int = 1,
           activation: ActivationArg = None,
           out: Optional[np.ndarray] = None) -> np.ndarray:
    """2-D convolution of ``x`` (N, C, H, W) or (C, H, W) with ``weight`` (K, C/groups, R, S).

    ``stride``, ``dilation``: int or (h, w). ``padding``: int, (h, w), ((top, bottom), (left,
    right)), 'valid' or 'same' (output = ceil(input / stride), an odd extra row or column at
    the end). ``activation``: None, a name ('relu', 'relu6', 'silu', ...) or a
    ``cso.Activation`` with its parameters, applied as the output is stored. ``out``: optional
    array of the output shape and dtype to write into (any strides; not overlapping ``x``).
    """
    args.check_array("input", x)
    args.check_array("weight", weight)
    if x.dtype != weight.dtype:
        raise TypeError(f"input dtype {x.dtype} differs from weight dtype {weight.dtype}; "
                        "mixed dtypes are not supported")
    return Conv2d(weight, bias, stride, padding, dilation, groups, activation,
                  input_shape=x.shape)(x, out=out)


def warmup(convolutions: Iterable[Union[csa.ConvSpec, str]],
           threads: Optional[int] = None) -> float:
    """Compile, or load from the persistent cache, everything the ``convolutions`` need, so
    that their first calls run at full speed: ``convolutions`` is an iterable of
    ``csa.ConvSpec`` or their names (``str(spec)``, e.g. ``"n1c64h56w56k64r3s3p1u1"``), planned
    for up to ``threads`` threads (default ``get_num_threads()``). Returns the seconds spent.
    (A ``Conv2d`` built with ``input_shape`` does the same for its own shape.)"""
    start = time.perf_counter()
    threads = get_num_threads() if threads is None else threads
    for spec in (host.as_spec(c, "warmup") for c in convolutions):
        t, b, left, right = spec.padding
        conv = Conv2d(np.zeros(spec.weight_shape, spec.dtype), None, spec.stride,
                      ((t, b), (left, right)), spec.dilation, spec.groups)
        conv._prepared(spec.input_shape, np.dtype(spec.dtype), threads).warm(threads)
    return time.perf_counter() - start

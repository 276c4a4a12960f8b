"""LLVM IR generator for the depthwise micro-kernel on channel-blocked activations
(``BlockedDepthwiseSpec``): a run of ``windows`` output pixels of one block of channels.

Contract: with the block's lanes as vectors (one channel each),

    out[t*lanes : (t+1)*lanes] = act(sum_{i < taps} x[offsets[i] + t*step : ... + lanes]
                                     * weights[i*lanes : (i+1)*lanes] (+ bias[0:lanes]))
                                                                     for t < spec.windows

``offsets`` (int64, elements) place the taps on the input's blocks (or a slab of them) from the
first window's, ``step`` is the distance between windows (the stride times the block).
``flags``: BIAS adds ``bias`` (read only then), ACTIVATE applies ``spec.activation`` with its
parameters at ``params``. Every lane is computed: the loop nest passes blocks whose padding
lanes have zero weights and bias. The taps run in a loop, the windows unrolled: ``windows``
accumulators, each tap one weight vector and one load per window, the load folded into its
FMA. No edge cases: the loop nest calls a kernel of ``windows - 1`` for a row's shorter tiles
(as a direct plan's, ``csa.layout.balanced_row_windows``).
"""
from llvmlite import ir

from .activation import apply, load_params
from .ir import ACTIVATE, BIAS, I64, PTR, KernelBuilder, flags_on, fma

ARG_NAMES = ("taps", "x", "offsets", "step", "weights", "out", "bias", "flags", "params")
FUNCTION_TYPE = ir.FunctionType(ir.VoidType(), [I64, PTR, PTR, I64, PTR, PTR, PTR, I64, PTR])


def define_blocked_depthwise(module, spec):
    """Define the kernel for ``spec`` (a ``BlockedDepthwiseSpec``) in ``module``; return it."""
    return _Builder(module, spec).build()


class _Builder(KernelBuilder):
    FUNCTION_TYPE, ARG_NAMES, NOALIAS = FUNCTION_TYPE, ARG_NAMES, ("x", "out")

    def build(self):
        spec, a = self.spec, self.args
        fma_call = fma(self.module, self.vec)
        entry = self.fn.append_basic_block("entry")
        loop, done = self.fn.append_basic_block("taps"), self.fn.append_basic_block("stores")
        bld = ir.IRBuilder(entry)
        steps = [bld.mul(ir.Constant(I64, t), a["step"]) for t in range(spec.windows)]
        bld.cbranch(bld.icmp_signed(">", a["taps"], ir.Constant(I64, 0)), loop, done)
        bld.position_at_end(loop)
        i = bld.phi(I64, name="i")
        accs = [bld.phi(self.vec) for _ in range(spec.windows)]
        offset = bld.load(bld.gep(a["offsets"], [i], inbounds=True, source_etype=I64), typ=I64,
                          align=8)
        weight = self._load(bld, a["weights"], bld.mul(i, ir.Constant(I64, self.lanes)))
        new = [bld.call(fma_call, [self._load(bld, a["x"], bld.add(offset, steps[t])), weight,
                                   acc]) for t, acc in enumerate(accs)]
        following = bld.add(i, ir.Constant(I64, 1))
        bld.cbranch(bld.icmp_signed("<", following, a["taps"]), loop, done)
        i.add_incoming(ir.Constant(I64, 0), entry)
        i.add_incoming(following, loop)
        for acc, value in zip(accs, new):
            acc.add_incoming(self.zero, entry)
            acc.add_incoming(value, loop)
        bld.position_at_end(done)
        sums = [bld.phi(self.vec) for _ in range(spec.windows)]
        for total, value in zip(sums, new):
            total.add_incoming(self.zero, entry)
            total.add_incoming(value, loop)
        self._store(bld, sums)
        return self.fn

    def _load(self, bld, base, at):
        ptr = bld.gep(base, [at], inbounds=True, source_etype=self.scalar)
        return bld.load(ptr, typ=self.vec, align=self.align)

    def _store(self, bld, sums):
        """Bias, activation (behind a branch on its flag: a costly one is not computed for
        nothing) and the stores."""
        a = self.args
        bias_on, activate_on = flags_on(bld, a["flags"], BIAS, ACTIVATE)
        bias = self._load_bias(bld, bias_on)
        params = load_params(bld, self.spec.activation, a["params"], self)
        values = [bld.fadd(total, bias) for total in sums]
        plain, activated = (self.fn.append_basic_block(n) for n in ("plain", "activated"))
        bld.cbranch(activate_on, activated, plain)
        for block, act in ((plain, False), (activated, True)):
            bld.position_at_end(block)
            for t, value in enumerate(values):
                if act:
                    value = apply(bld, self.spec.activation, value, params)
                ptr = bld.gep(a["out"], [ir.Constant(I64, t * self.lanes)], inbounds=True,
                              source_etype=self.scalar)
                bld.store(value, ptr, align=self.align)
            bld.ret_void()

    def _load_bias(self, bld, bias_on):
        """The bias vector, or a zero vector's (from a slot: ``bias`` is not read then)."""
        slot = bld.alloca(self.vec)
        bld.store(self.zero, slot)
        return bld.load(bld.select(bias_on, self.args["bias"], slot), typ=self.vec,
                        align=self.align)

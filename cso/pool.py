"""The thread pool's compiled side (``cso.threads`` runs it): workers and callers that never
hold the GIL while a call's parts run.

A job is ``nparts`` calls ``fn(args, i)`` of a C function ``void fn(int64 *args, int64 part)``
(the call's arguments are shared; each part finds its own from its number). The
pool's state is one int64 array (``STATE_WORDS``, its hot words a cache line apart):

- ``lanes``: the job's parts in near-equal runs, one a thread (``lanes`` of them, from
  ``LANE0``, a cache line apart), each a word: job number << 32 | end << 16 | next part.
  Thread ``rank`` takes the parts of lane ``rank`` first, each with a compare-and-swap on its
  word (the next one), so that a thread keeps the same share of the output from one job to
  the next (its filters and activations hot in its own L2); a thread whose lane is empty takes
  the other lanes' last parts. A part runs exactly once and a stale thread cannot take a part
  of a later job (the job number differs); a thread that is late (descheduled, waking up)
  takes fewer, as the others empty its lane from the end; ``job``: the job's number;
- ``done``: parts finished, which the caller waits for; ``busy``: a caller owns the pool
  (another caller meanwhile runs its parts itself); ``fn``, ``args``: the job;
  ``helpers``: how many workers (ranks 1..helpers) may take its parts;
- ``wake`` (32-bit) and ``sleepers``: a worker that found nothing for ``spin`` nanoseconds
  sleeps on ``wake`` (a futex on Linux, else short sleeps); a caller bumps it and wakes the
  sleepers. Past ``HOT_SPIN_NS`` of that spin it yields its CPU at each look: another thread
  that wants the core (the caller's own code, NumPy's BLAS threads, another process) gets it,
  and an idle core stays busy with the worker, and so awake;
- ``spin``: the workers' spin window (ns, ``cso.threads.set_spin``);
- ``alone_until``, ``backoff``, ``last_stall``: a caller that waited on a worker's part far
  longer than its own parts took (a stall: the worker lost its CPU mid-part, to another
  process or another pool's threads) runs the jobs of the next ``backoff`` ns alone, the
  backoff growing for stalls that follow each other (within ``CALM_NS`` of the last backoff's
  end) and starting again at ``MIN_BACKOFF_NS`` after a calm spell; the workers sleep
  meanwhile, leaving the core to that other work. On a core shared with other work the second
  thread costs a stall now and then instead of one in every job;
- ``warm_until``: a caller that finds workers asleep (a pause longer than their spin) wakes
  them, shares its job (a worker still waking takes none of a short job's parts: the caller
  claims them first), and runs the jobs of the next ``WARM_NS`` alone while they come up to
  speed (their cores, idle until then, ran the first parts slowly: at 2 threads, the run of a
  small model after a 50 ms pause took twice its time back to back). Its own job ran alone
  too, once: a job longer than the spin window then found them asleep again at its end, and
  so did every later one (a 23-GFLOP layer at 2 threads ran at 1 thread's speed for good).

Times come from ``clock_gettime`` (monotonic). ``pool_worker(state, rank)`` never returns: a
worker thread lives in it. ``pool_run(state, fn, args, nparts, helpers, spin)`` runs a job on
the caller and up to ``helpers`` workers, or on the caller alone when another caller owns the
pool or a stall's backoff runs, and returns when every part has run (waiting ``spin`` ns,
at most ``CALLER_SPIN_NS``, before it yields its CPU between looks).
``pool_run_jobs(state, jobs, count, threads, spin)`` runs ``count`` jobs one after the other,
each an (fn, args, nparts) triple of int64 at ``jobs``, on up to ``threads`` threads: a
model's recorded steps in one call. All are called through ctypes, which releases the GIL for
their whole run.
"""
import ctypes
import platform
import sys
from types import SimpleNamespace

from llvmlite import ir

from microkernels.jit import native_function
from microkernels.once import compiled_once

JOB, DONE, BUSY, FN, ARGS, HELPERS, LANES, WAKE, SLEEPERS = 0, 8, 16, 24, 25, 27, 28, 32, 40
SPIN, ALONE_UNTIL, BACKOFF, LAST_STALL, WARM_UNTIL = 48, 49, 50, 51, 52
PART_BITS = 16   # parts per job < 2**16
MAX_PARTS = (1 << PART_BITS) - 1
# lanes: one a thread, up to MAX_LANES (threads past it share lanes), a cache line apart
LANE0, LANE_WORDS, MAX_LANES = 64, 8, 64
STATE_WORDS = LANE0 + LANE_WORDS * MAX_LANES
# futex(2) numbers; elsewhere a sleeping worker polls every SLEEP_US microseconds
FUTEX_SYSCALL = {"x86_64": 202, "aarch64": 98}
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129
SLEEP_US = 100
# clock_gettime's CLOCK_MONOTONIC by OS (1 elsewhere: the usual value)
CLOCK_MONOTONIC = {"darwin": 6, "macos": 6, "freebsd": 4}
POLLS_A_LOOK = 32     # polls between two readings of the clock while spinning
# a stall: the caller waited on the workers' parts more than STALL_PARTS times its own parts'
# average, and STALL_NS more (a worker that is merely slower -- a core waking up, a VM's
# hiccup of a few hundred us -- is not one; a core taken by another process is lost for ms)
STALL_PARTS, STALL_NS = 2, 500_000
MIN_BACKOFF_NS, MAX_BACKOFF_NS = 2_000_000, 200_000_000
BACKOFF_GROWTH = 2    # the backoff's factor from one stall to the next
# a stall this long after the last backoff ended starts again at the least: stalls that come
# sooner (another process busy on the core: ResNet-18, one stall a run of 65 ms) lengthen it;
# rare ones (a VM's hiccups: a few a second) keep it short
CALM_NS = 100_000_000
WARM_NS = 1_000_000   # callers run alone this long after waking sleeping workers
# an idle worker spins this long, then yields its CPU at each look (every POLLS_A_LOOK polls)
# until its spin window ends: a busy process beside it takes the core, an idle core stays awake
HOT_SPIN_NS = 5_000_000
# a caller waits for its job's end at most this long (or the spin window, if shorter) before
# it yields its CPU between looks: a worker that has not finished by then has likely lost its
# core, which may be the one the caller holds (more threads than cores)
CALLER_SPIN_NS = 5_000_000

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
PART_FN = ir.FunctionType(ir.VoidType(), [PTR, I64])   # void fn(int64 *args, int64 part)


def _futex_number(triple):
    if not sys.platform.startswith("linux"):
        return None
    return FUTEX_SYSCALL.get(triple.split("-")[0], FUTEX_SYSCALL.get(platform.machine()))


class _Builder(ir.IRBuilder):
    """IRBuilder with the pool's state words, part calls and named blocks."""

    def word(self, state, index):
        """Address of word ``index`` (the 32-bit ``wake`` is its low half: little-endian)."""
        return self.gep(state, [ir.Constant(I64, index)], source_etype=I64)

    def lane_word(self, state, lane):
        """Address of lane ``lane``'s word (an I64 value)."""
        index = self.add(self.mul(lane, ir.Constant(I64, LANE_WORDS)), ir.Constant(I64, LANE0))
        return self.gep(state, [index], source_etype=I64)

    def load_word(self, state, index, order="acquire", typ=I64):
        return self.load_atomic(self.word(state, index), order, typ.width // 8, typ=typ)

    def store_word(self, value, state, index, order="release"):
        # an exchange: llvmlite's store_atomic wants a typed pointer
        self.atomic_rmw("xchg", self.word(state, index), value, order)

    def add_word(self, state, index, value, order="seq_cst"):   # value's type: the word's
        return self.atomic_rmw("add", self.word(state, index), value, order)

    def call_part(self, target, args, part):
        """``target(args, part)``, ``target`` and ``args`` integer addresses."""
        self.call(self.inttoptr(target, PART_FN.as_pointer()), [self.inttoptr(args, PTR), part])

    def new_block(self, name):
        return self.function.append_basic_block(name)

    def count_up(self, count, after, name):
        """Start ``for i in range(count)`` from the current block: return ``i``, with the
        builder in the loop's body, and ``close()``, which ends the body and leaves the
        builder in ``after``, the block the loop exits to."""
        entered = self.block
        test, body = self.new_block(f"{name}_loop"), self.new_block(f"{name}_body")
        self.branch(test)
        self.position_at_end(test)
        i = self.phi(I64)
        i.add_incoming(ir.Constant(I64, 0), entered)
        self.cbranch(self.icmp_unsigned("<", i, count), body, after)
        self.position_at_end(body)

        def close():
            i.add_incoming(self.add(i, ir.Constant(I64, 1)), self.block)
            self.branch(test)
            self.position_at_end(after)
        return i, close


def _declare(module, name, ret, args, var_arg=False):
    return ir.Function(module, ir.FunctionType(ret, args, var_arg=var_arg), name)


def _define_run_one(module, find_lane):
    """``i1 run_one(state, rank)``: claim one part of the current job and run it (the next of
    thread ``rank``'s own lane, else the last of another's: ``find_lane``); false when no part
    is left that ``rank`` may take (true after a lost race: try again)."""
    fn = ir.Function(module, ir.FunctionType(I1, [PTR, I64]), "run_one")
    fn.linkage = "internal"
    state, rank = fn.args
    bld = _Builder(fn.append_basic_block("entry"))
    have, none, check, lost, won = (bld.new_block(n)
                                    for n in ("have", "none", "check", "lost", "won"))
    lane = bld.call(find_lane, [state, rank])
    bld.cbranch(bld.icmp_signed("<", lane, ir.Constant(I64, 0)), none, have)
    bld.position_at_end(none)
    bld.ret(ir.Constant(I1, 0))
    bld.position_at_end(have)
    word = bld.lane_word(state, lane)
    claim = bld.load_atomic(word, "acquire", 8, typ=I64)
    first, end = _lane_range(bld, claim)
    bld.cbranch(bld.icmp_unsigned("<", first, end), check, lost)
    bld.position_at_end(check)
    # its own lane from the front, another's from the back
    own = bld.icmp_unsigned("==", lane,
                            _home_lane(bld, rank, bld.load_word(state, LANES, "monotonic")))
    part = bld.select(own, first, bld.sub(end, ir.Constant(I64, 1)))
    taken = bld.select(own, bld.add(claim, ir.Constant(I64, 1)),
                       bld.sub(claim, ir.Constant(I64, 1 << PART_BITS)))
    swapped = bld.cmpxchg(word, claim, taken, "acq_rel", "acquire")
    bld.cbranch(bld.extract_value(swapped, 1), won, lost)
    bld.position_at_end(lost)
    bld.ret(ir.Constant(I1, 1))
    bld.position_at_end(won)   # the job's words were published before its lanes
    bld.call_part(bld.load_word(state, FN, "monotonic"), bld.load_word(state, ARGS, "monotonic"),
                  part)
    bld.add_word(state, DONE, ir.Constant(I64, 1), "release")
    bld.ret(ir.Constant(I1, 1))
    return fn


def _lane_range(bld, claim):
    """(next part, end) of a lane's word."""
    mask = ir.Constant(I64, MAX_PARTS)
    return bld.and_(claim, mask), bld.and_(bld.lshr(claim, ir.Constant(I64, PART_BITS)), mask)


def _home_lane(bld, rank, lanes):
    """Thread ``rank``'s own lane: ``rank`` modulo the job's ``lanes`` (at least 1)."""
    one = ir.Constant(I64, 1)
    return bld.urem(rank, bld.select(bld.icmp_unsigned("<", lanes, one), one, lanes))


def _define_find_lane(module, order):
    """``i64 find_lane_<order>(state, rank)``: the first lane with a part left, from thread
    ``rank``'s own on, if the job lets ``rank`` help (the caller is rank 0, workers 1, 2, ...);
    else -1. Another lane counts only once its own is the same job's: the lanes are published
    one by one, and a thread that saw another's lane before its own took that one's last part
    (two threads, 128 -> 128 3x3 of 2 groups at 56 x 56: the workers' first parts, in 40% of
    calls, each then running another's filters). Its loads of the lanes are ``order``'s."""
    fn = ir.Function(module, ir.FunctionType(I64, [PTR, I64]), f"find_lane_{order}")
    fn.linkage = "internal"
    state, rank = fn.args
    bld = _Builder(fn.append_basic_block("entry"))
    scan, none, found, other = (bld.new_block(n) for n in ("scan", "none", "found", "other"))
    allowed = bld.icmp_unsigned("<=", rank, bld.load_word(state, HELPERS, "monotonic"))
    bld.cbranch(allowed, scan, none)
    bld.position_at_end(scan)
    lanes = bld.load_word(state, LANES, "monotonic")
    home = _home_lane(bld, rank, lanes)
    job = bld.lshr(bld.load_atomic(bld.lane_word(state, home), order, 8, typ=I64),
                   ir.Constant(I64, 32))
    j, close = bld.count_up(lanes, none, "lanes")
    lane = bld.add(home, j)
    lane = bld.select(bld.icmp_unsigned("<", lane, lanes), lane, bld.sub(lane, lanes))
    claim = bld.load_atomic(bld.lane_word(state, lane), order, 8, typ=I64)
    first, end = _lane_range(bld, claim)
    open_ = bld.and_(bld.icmp_unsigned("<", first, end),
                     bld.icmp_unsigned("==", bld.lshr(claim, ir.Constant(I64, 32)), job))
    bld.cbranch(open_, found, other)
    bld.position_at_end(found)
    bld.ret(lane)
    bld.position_at_end(other)
    close()
    bld.ret(ir.Constant(I64, -1))
    return fn


def _sched_yield(module):
    return module.globals.get("sched_yield") or _declare(module, "sched_yield", I32, [])


def _pause(module, bld, triple):
    if triple.startswith(("x86_64", "i686", "i386")):
        name = "llvm.x86.sse2.pause"
        pause = module.globals.get(name) or _declare(module, name, ir.VoidType(), [])
        bld.call(pause, [])


def _define_sleep_and_wake(module, triple):
    """``sleep(word, seen)``: wait until the 32-bit ``word`` may differ from ``seen``;
    ``wake_all(word)``: wake every thread sleeping on it."""
    sleep = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I32]), "sleep")
    wake = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), "wake_all")
    sleep.linkage = wake.linkage = "internal"
    sleep_bld, wake_bld = (_Builder(fn.append_basic_block("entry")) for fn in (sleep, wake))
    futex = _futex_number(triple)
    if futex is None:
        usleep = _declare(module, "usleep", I32, [I32])
        sleep_bld.call(usleep, [ir.Constant(I32, SLEEP_US)])
    else:
        syscall = _declare(module, "syscall", I64, [I64], var_arg=True)
        for bld, word, op, value in (
                (sleep_bld, sleep.args[0], FUTEX_WAIT_PRIVATE, sleep_bld.zext(sleep.args[1], I64)),
                (wake_bld, wake.args[0], FUTEX_WAKE_PRIVATE, ir.Constant(I64, 2**31 - 1))):
            zero = ir.Constant(I64, 0)
            bld.call(syscall, [ir.Constant(I64, futex), bld.ptrtoint(word, I64),
                               ir.Constant(I64, op), value, zero, zero, zero])
    sleep_bld.ret_void()
    wake_bld.ret_void()
    return sleep, wake


def _define_clock(module, triple):
    """``now()``: monotonic nanoseconds (``clock_gettime``); where that call fails, a count
    going up a microsecond a reading, so that spins still end."""
    fn = ir.Function(module, ir.FunctionType(I64, []), "now")
    fn.linkage = "internal"
    bld = _Builder(fn.append_basic_block("entry"))
    failed, read = bld.new_block("failed"), bld.new_block("read")
    clock = next((number for os_name, number in CLOCK_MONOTONIC.items() if os_name in triple), 1)
    spec = bld.alloca(ir.ArrayType(I64, 2))    # struct timespec: seconds, nanoseconds
    gettime = _declare(module, "clock_gettime", I32, [I32, PTR])
    status = bld.call(gettime, [ir.Constant(I32, clock), spec])
    bld.cbranch(bld.icmp_signed("==", status, ir.Constant(I32, 0)), read, failed)
    bld.position_at_end(read)
    seconds, nanoseconds = (bld.load(bld.gep(spec, [ir.Constant(I64, 0), ir.Constant(I32, k)],
                                             source_etype=spec.allocated_type), typ=I64)
                            for k in (0, 1))
    bld.ret(bld.add(bld.mul(seconds, ir.Constant(I64, 10 ** 9)), nanoseconds))
    bld.position_at_end(failed)
    counter = ir.GlobalVariable(module, I64, "fallback_clock")
    counter.linkage, counter.initializer = "internal", ir.Constant(I64, 0)
    bld.ret(bld.atomic_rmw("add", counter, ir.Constant(I64, 1000), "monotonic"))
    return fn


def _every_look(bld, polls):
    """Whether poll ``polls`` is one that reads the clock (every POLLS_A_LOOK-th)."""
    return bld.icmp_unsigned("==", bld.and_(polls, ir.Constant(I64, POLLS_A_LOOK - 1)),
                             ir.Constant(I64, 0))


def _define_worker(module, triple, run_one, find_lane, sleep, now):
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64]), "pool_worker")
    state, rank = fn.args
    bld = _Builder(fn.append_basic_block("entry"))
    loop, idle, look, keep, polite, doze, nap, woke = (
        bld.new_block(n) for n in ("loop", "idle", "look", "keep", "polite", "doze", "nap",
                                   "woke"))
    zero = ir.Constant(I64, 0)
    bld.branch(loop)
    bld.position_at_end(loop)
    # polls since the last part ran, and when the first of them read the clock
    polls, since = bld.phi(I64), bld.phi(I64)
    for value in (polls, since):
        value.add_incoming(zero, fn.entry_basic_block)
    ran = bld.call(run_one, [state, rank])
    for value in (polls, since):
        value.add_incoming(zero, loop)
    bld.cbranch(ran, loop, idle)
    bld.position_at_end(idle)
    _pause(module, bld, triple)
    polls_next = bld.add(polls, ir.Constant(I64, 1))
    polls.add_incoming(polls_next, idle)
    since.add_incoming(since, idle)
    bld.cbranch(_every_look(bld, polls), look, loop)
    bld.position_at_end(look)   # spun for the window (``spin``, read anew: it may change)?
    t = bld.call(now, [])
    since_now = bld.select(bld.icmp_unsigned("==", polls, zero), t, since)
    spin = bld.load_word(state, SPIN, "monotonic")
    backing_off = bld.icmp_signed("<", t, bld.load_word(state, ALONE_UNTIL, "monotonic"))
    idle_for = bld.sub(t, since_now)
    bld.cbranch(bld.or_(backing_off, bld.icmp_signed(">=", idle_for, spin)), doze, keep)
    # past HOT_SPIN_NS, spin politely: yield the CPU at each look, so that another thread
    # that wants this core (another process's, the caller's) takes it, while an idle core
    # stays busy with this one and so awake
    bld.position_at_end(keep)
    bld.cbranch(bld.icmp_signed(">=", idle_for, ir.Constant(I64, HOT_SPIN_NS)), polite, loop)
    bld.position_at_end(polite)
    bld.call(_sched_yield(module), [])
    bld.branch(loop)
    for block in (keep, polite):
        polls.add_incoming(polls_next, block)
        since.add_incoming(since_now, block)
    # announce the sleep before the last look for work: a caller that posts after that look
    # sees the sleeper and wakes it, and one that posted before it is seen by the look
    bld.position_at_end(doze)
    bld.add_word(state, SLEEPERS, ir.Constant(I64, 1))
    seen = bld.load_word(state, WAKE, "seq_cst", I32)
    has_part = bld.icmp_signed(">=", bld.call(find_lane, [state, rank]), zero)
    bld.cbranch(has_part, woke, nap)
    bld.position_at_end(nap)
    bld.call(sleep, [bld.word(state, WAKE), seen])
    bld.branch(woke)
    bld.position_at_end(woke)
    bld.add_word(state, SLEEPERS, ir.Constant(I64, -1))
    for value in (polls, since):
        value.add_incoming(zero, woke)
    bld.branch(loop)
    return fn


def _define_run(module, triple, run_one, wake_all, now):
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64, I64, I64, I64]),
                     "pool_run")
    state, target, args, nparts, helpers, spin = fn.args
    bld = _Builder(fn.append_basic_block("entry"))
    names = ("backoff", "claim", "alone", "asleep", "rouse", "posted", "wake", "work", "waiting",
             "wait", "poll", "look", "yield", "finished", "stalled", "release", "return")
    (backoff, claim_pool, alone, asleep, rouse, posted, wake, work, waiting, wait, poll, look,
     give_way, finished, stalled, release, done) = (bld.new_block(n) for n in names)
    zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)
    # the pool, if there are parts and threads to share, no stall's backoff runs and no other
    # caller owns it
    shared = bld.and_(bld.icmp_unsigned(">", nparts, one), bld.icmp_signed(">", helpers, zero))
    bld.cbranch(shared, backoff, alone)
    bld.position_at_end(backoff)
    start = bld.call(now, [])
    calm = bld.and_(bld.icmp_signed(">=", start, bld.load_word(state, ALONE_UNTIL, "monotonic")),
                    bld.icmp_signed(">=", start, bld.load_word(state, WARM_UNTIL, "monotonic")))
    bld.cbranch(calm, claim_pool, alone)
    bld.position_at_end(claim_pool)
    owned = bld.extract_value(bld.cmpxchg(bld.word(state, BUSY), zero, one, "acquire",
                                          "monotonic"), 1)
    bld.cbranch(owned, asleep, alone)

    # workers asleep (after a pause longer than their spin) take long to wake and their cores
    # run slowly at first: this job is shared (posted, which wakes them), the jobs of the next
    # WARM_NS run alone while they wake and spin (unless they sleep at once: ``spin`` 0)
    bld.position_at_end(asleep)
    sleeping = bld.icmp_signed(">", bld.load_word(state, SLEEPERS, "seq_cst"), zero)
    bld.cbranch(bld.and_(sleeping, bld.icmp_signed(">", spin, zero)), rouse, posted)
    bld.position_at_end(rouse)
    bld.store_word(bld.add(start, ir.Constant(I64, WARM_NS)), state, WARM_UNTIL, "monotonic")
    bld.branch(posted)

    bld.position_at_end(alone)   # every part on this thread
    i, close = bld.count_up(nparts, done, "alone")
    bld.call_part(target, args, i)
    close()

    bld.position_at_end(posted)   # publish the job, then its lanes, then wake sleepers
    lanes = bld.add(helpers, one)
    lanes = bld.select(bld.icmp_unsigned("<", lanes, ir.Constant(I64, MAX_LANES)), lanes,
                       ir.Constant(I64, MAX_LANES))
    number = bld.add(bld.load_word(state, JOB, "monotonic"), one)
    for index, value in ((FN, target), (ARGS, args), (HELPERS, helpers), (DONE, zero),
                         (LANES, lanes), (JOB, number)):
        bld.store_word(value, state, index, "monotonic")
    lane, close = bld.count_up(lanes, bld.new_block("lanes_set"), "lanes")
    first, end = (bld.udiv(bld.mul(nparts, k), lanes) for k in (lane, bld.add(lane, one)))
    job = bld.shl(bld.and_(number, ir.Constant(I64, 0xFFFFFFFF)), ir.Constant(I64, 32))
    bld.atomic_rmw("xchg", bld.lane_word(state, lane),
                   bld.or_(bld.or_(job, bld.shl(end, ir.Constant(I64, PART_BITS))), first),
                   "seq_cst")
    close()
    published = bld.block
    bld.add_word(state, WAKE, ir.Constant(I32, 1))
    sleepers = bld.load_word(state, SLEEPERS, "seq_cst")
    bld.cbranch(bld.icmp_signed(">", sleepers, zero), wake, work)
    bld.position_at_end(wake)
    bld.call(wake_all, [bld.word(state, WAKE)])
    bld.branch(work)

    bld.position_at_end(work)   # take parts like any worker, counting them
    taken = bld.phi(I64)
    taken.add_incoming(zero, published)
    taken.add_incoming(zero, wake)
    taken.add_incoming(bld.add(taken, one), work)
    bld.cbranch(bld.call(run_one, [state, zero]), work, waiting)

    bld.position_at_end(waiting)   # until the workers' parts are done: spin, then yield
    waited_from = bld.call(now, [])
    caller_spin = ir.Constant(I64, CALLER_SPIN_NS)
    caller_spin = bld.select(bld.icmp_signed("<", spin, caller_spin), spin, caller_spin)
    bld.branch(wait)
    bld.position_at_end(wait)
    polls = bld.phi(I64)
    polls.add_incoming(zero, waiting)
    bld.cbranch(bld.icmp_unsigned(">=", bld.load_word(state, DONE), nparts), finished, poll)
    bld.position_at_end(poll)
    _pause(module, bld, triple)
    polls_next = bld.add(polls, one)
    polls.add_incoming(polls_next, poll)
    bld.cbranch(_every_look(bld, polls_next), look, wait)
    bld.position_at_end(look)
    polls.add_incoming(polls_next, look)
    bld.cbranch(bld.icmp_signed(">", bld.sub(bld.call(now, []), waited_from), caller_spin),
                give_way, wait)
    bld.position_at_end(give_way)
    bld.call(_sched_yield(module), [])
    polls.add_incoming(polls_next, give_way)
    bld.branch(wait)

    bld.position_at_end(finished)   # a stall: the wait far longer than the caller's own parts
    end = bld.call(now, [])
    own = bld.sdiv(bld.sub(waited_from, start), bld.select(
        bld.icmp_signed(">", taken, zero), taken, one))
    limit = bld.add(bld.mul(own, ir.Constant(I64, STALL_PARTS)), ir.Constant(I64, STALL_NS))
    stall = bld.and_(bld.icmp_signed(">", taken, zero),
                     bld.icmp_signed(">", bld.sub(end, waited_from), limit))
    bld.cbranch(stall, stalled, release)
    bld.position_at_end(stalled)   # back off: longer than last time, or anew after a calm spell
    last = bld.load_word(state, BACKOFF, "monotonic")
    shared_since = bld.add(bld.load_word(state, LAST_STALL, "monotonic"), last)
    calm = bld.icmp_signed(">", bld.sub(end, shared_since), ir.Constant(I64, CALM_NS))
    longer = bld.mul(last, ir.Constant(I64, BACKOFF_GROWTH))
    longer = bld.select(bld.icmp_signed("<", longer, ir.Constant(I64, MAX_BACKOFF_NS)),
                        longer, ir.Constant(I64, MAX_BACKOFF_NS))
    length = bld.select(calm, ir.Constant(I64, MIN_BACKOFF_NS), longer)
    for index, value in ((BACKOFF, length), (LAST_STALL, end),
                         (ALONE_UNTIL, bld.add(end, length))):
        bld.store_word(value, state, index, "monotonic")
    bld.branch(release)
    bld.position_at_end(release)
    bld.store_word(zero, state, BUSY)
    bld.branch(done)
    bld.position_at_end(done)
    bld.ret_void()
    return fn


def _define_run_jobs(module, run):
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64, I64]),
                     "pool_run_jobs")
    state, jobs, count, threads, spin = fn.args
    bld = _Builder(fn.append_basic_block("entry"))
    done = bld.new_block("done")
    i, close = bld.count_up(count, done, "jobs")
    target, args, nparts = (
        bld.load(bld.gep(jobs, [bld.add(bld.mul(i, ir.Constant(I64, 3)), ir.Constant(I64, word))],
                         source_etype=I64), typ=I64)
        for word in range(3))
    share = bld.select(bld.icmp_unsigned("<", nparts, threads), nparts, threads)
    bld.call(run, [state, target, args, nparts, bld.sub(share, ir.Constant(I64, 1)), spin])
    close()
    bld.ret_void()


def define_pool(module):
    """The pool's functions in ``module`` (whose triple chooses the sleep): ``pool_worker``,
    ``pool_run_jobs`` and ``pool_run``, returned."""
    triple = module.triple
    find_lane = _define_find_lane(module, "acquire")
    run_one = _define_run_one(module, find_lane)
    sleep, wake_all = _define_sleep_and_wake(module, triple)
    now = _define_clock(module, triple)
    _define_worker(module, triple, run_one, _define_find_lane(module, "seq_cst"), sleep, now)
    run = _define_run(module, triple, run_one, wake_all, now)
    _define_run_jobs(module, run)
    return run


@compiled_once
def compiled_pool():
    """``.worker(state, rank)``, ``.run(state, fn, args, nparts, helpers, spin)`` and
    ``.run_jobs(state, jobs, count, threads, spin)`` (ctypes, addresses as integers)."""
    compiled = native_function(define_pool).module
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return SimpleNamespace(worker=compiled.function("pool_worker", None, ptr, i64),
                           run=compiled.function("pool_run", None, ptr, i64, i64, i64, i64, i64),
                           run_jobs=compiled.function("pool_run_jobs", None, ptr, ptr, i64, i64,
                                                      i64))

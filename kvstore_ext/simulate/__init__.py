"""A discrete-event simulator: virtual workers driving the very policies the servers run.

Each virtual worker computes for its iteration time, pushes, and starts its
next iteration when the policy gives it OK (under ``dist_psp``: when the block's
round closes, or at once if its push was dropped as late).  Every registry row
with a policy is simulated, with its example settings.  No processes, no arrays: it runs
thousands of workers in seconds, and answers "how many iterations does each
paradigm get through in a given time on this cluster" before any training.

    python -m kvstore_ext.simulate --speeds 1.0,0.43 --time 1000
    python -m kvstore_ext.simulate --device 200ms*8 --straggler-pattern transient:0.05:3:2 --time 60
    python -m kvstore_ext.simulate --device 148ms*8 --servers 4 --reply-delays 0,0,0,1.5 \
        --kv-param min_pull_fraction=0.75 --time 60

With ``--train CONFIG`` it trains: the experiment's model on its data, every cluster's workers
in virtual time, through the same policies and the servers' optimizer code
(:mod:`kvstore_ext.virtual_training`), with reproduce.py's table and plots:

    python -m kvstore_ext.simulate --train configs/virtual/mnist_16.yaml --out results/v16
"""
from __future__ import annotations

import argparse
import heapq
import json
import random
from dataclasses import dataclass, field

from ..devices import PATTERN_HELP, DeviceClock, count_devices
from ..policies.base import MAX_REPLY_HOLD_S
from ..policies.psp import PartialPull
from ..stragglers import stretched_time
from .. import registry


@dataclass
class SimResult:
    """What a simulated run did."""

    iterations: dict[int, int]
    wait_time: dict[int, float]
    max_lead_at_ok: int
    decisions: int
    horizon: float
    leads: list[int] = field(default_factory=list)
    dropped: int = 0            # pushes dropped as late (dist_psp)
    #: staleness -> applied pushes: the updates the server applied between the pusher's read
    #: of the weights and the push's own application (per block under dist_psp)
    staleness: dict[int, int] = field(default_factory=dict)
    #: with ``record``: the policy's report, as a real server's metrics give it (DSSP: its
    #: controller's decisions and the bound changes)
    report: dict = field(default_factory=dict)

    @property
    def total_iterations(self) -> int:
        return sum(self.iterations.values())

    @property
    def mean_staleness(self) -> float | None:
        """The mean over applied pushes; None when none was applied."""
        applied = sum(self.staleness.values())
        return sum(k * v for k, v in self.staleness.items()) / applied if applied else None

    def throughput(self) -> float:
        """Pushes per unit of time over all workers."""
        return self.total_iterations / self.horizon


def iteration_times(speeds, base_time: float = 1.0, jitter: float = 0.0, seed: int = 0,
                    clocks=None):
    """``time(worker, at)``: the length of the iteration ``worker`` starts at ``at``.

    With ``clocks`` (one :class:`~kvstore_ext.devices.DeviceClock` per worker), the emulated
    devices' times, draw for draw as the workers' own clocks give them.  Otherwise a worker of
    speed ``v`` takes ``base_time / v``, times a uniform factor in ``[1 - jitter, 1 + jitter]``
    but never under ``base_time``, as ``--worker-speed`` does (:func:`stretched_time`).
    """
    if clocks is not None:
        return lambda worker, at: clocks[worker].next_time(at)
    rng = random.Random(seed)

    def stretched(worker: int, at: float) -> float:
        draw = rng.uniform(-jitter, jitter) if jitter else 0.0
        return stretched_time(base_time, speeds[worker], draw)
    return stretched


def overhead_times(latency: float, release_latency: float, latency_jitter: float = 0.0,
                   seed: int = 0):
    """``cost(together)``: the time from a worker's OK to its next iteration's start when
    ``together`` workers are let go at once, ``latency + release_latency * together``, times
    a factor drawn uniformly from ``[1 - latency_jitter, 1 + latency_jitter]`` (a real host's
    push and pull vary: 0.6-1.6 times their median at the 10th and 90th percentiles with 8
    workers on 2 cores), from a generator of its own, so a jitter of 0 draws nothing and
    leaves every other draw as it was."""
    if not 0.0 <= latency_jitter <= 1.0:
        raise ValueError(f"latency_jitter {latency_jitter} must be in [0, 1]: a fraction of "
                         f"the latency")
    if not latency_jitter:
        return lambda together: latency + release_latency * together
    rng = random.Random(f"overhead:{seed}")

    def cost(together: int) -> float:
        return (latency + release_latency * together) * (
            1.0 + rng.uniform(-latency_jitter, latency_jitter))
    return cost


class SharedHost:
    """Every worker on one host's cores, as the emulated devices' real runs on one machine.

    A worker's exchange (from its OK to its next start: the reply, the next batch, the push's
    CPU) that begins while ``k`` other workers are in the host compute at the start of their
    iterations (their first ``host_time`` seconds) takes ``interference(k + 1)`` times as long
    (a slow-down at ``k + 1`` busy processes: the calibration's, or one measured for an
    exchange beside compute, :func:`~kvstore_ext.virtual_training.shared_host`).  Without it, two
    workers let go at one moment on equal devices push at the same instants for ever; on the
    machine the second one's exchange runs beside the first one's forward and backward pass
    and falls behind, until their host work no longer overlaps.  Measured on 2 workers, SSP
    s=3 (2026-12-01): consecutive pushes of the two workers were under 10 ms apart in 11-13%
    of cases on the machine and 42-45% in virtual time without this model.

    What counts as another worker "in its host compute" is, exactly, one whose last exchange
    began at or before ``at`` and whose host work after it has not ended: a worker still in
    its own exchange counts too.  So of workers let go at one moment, each after the first is
    slowed (the first's host work is about to run beside it); that is what sets them apart.
    Counting only host work under way at ``at`` left them in step (2 workers, SSP s=3: 27% of
    consecutive pushes under 10 ms apart against the machine's 11-13%, 2026-12-02).

    The count is kept in a heap of when each worker's host work ends, so a start costs
    O(log n); starts must come in order of time, as the simulator's do.
    """

    def __init__(self, host_time: float, interference):
        if not host_time >= 0:
            raise ValueError(f"host_time {host_time} must be seconds >= 0")
        self.host_time, self.interference = float(host_time), interference
        self._ends: list[tuple[float, int]] = []   # (when its host work ends, worker)
        self._until: dict[int, float] = {}          # worker -> its latest host work's end

    def fresh(self) -> "SharedHost":
        """The same host with nobody computing (one per simulated run)."""
        return SharedHost(self.host_time, self.interference)

    def exchange(self, worker: int, at: float, seconds: float) -> float:
        """How long ``worker``'s exchange of ``seconds`` alone takes when it begins at ``at``;
        its host work then starts when the exchange ends."""
        while self._ends and self._ends[0][0] <= at:
            until, w = heapq.heappop(self._ends)
            if self._until.get(w) == until:
                del self._until[w]
        others = len(self._until) - (worker in self._until)
        seconds *= float(self.interference(others + 1))
        until = at + seconds + self.host_time
        self._until[worker] = until
        heapq.heappush(self._ends, (until, worker))
        return seconds


def simulate(store_type: str, params: dict, speeds, horizon: float, base_time: float = 1.0,
             jitter: float = 0.0, seed: int = 0, latency: float = 0.0, clocks=None,
             release_latency: float = 0.0, servers: int = 1, reply_delays=None,
             blocks=None, service: float = 0.0, apply_time: float = 0.0,
             trainer=None, reply_hold: float = MAX_REPLY_HOLD_S, latency_jitter: float = 0.0,
             record: bool = False, shared_host: "SharedHost | None" = None) -> SimResult:
    """Run virtual workers with the given speeds (or device ``clocks``) until ``horizon``.

    Iteration times as :func:`iteration_times` gives them; ``latency`` is added between
    an OK and the next iteration's start (the pull and the push), plus ``release_latency``
    for each worker released at that same moment: k workers let go together (a BSP round)
    pull and start at once, and share the network and the hosts; ``latency_jitter`` varies
    that time per start (:func:`overhead_times`).  ``servers``,
    ``reply_delays`` (one per server: how late its replies are) and ``blocks`` (how many blocks
    each server holds) are modelled for stores whose rounds are per block (``dist_psp``: b, the
    fraction of blocks a worker waits for, then matters); the per-key policies are simulated as
    one server.  That server serves pushes one at a time, in the order they come, for
    ``service`` each, plus ``apply_time`` when the policy applies (the planner's server CPU): a
    worker's OK comes when its push has been served, and on an asynchronous store the reply
    with its weights waits, as a server's does, for the pushes already queued behind it (at
    most ``reply_hold``, the server's :data:`~kvstore_ext.policies.base.MAX_REPLY_HOLD_S`; 0:
    replies go at once, as the planner's closed form assumes): workers whose pushes come
    together read each other's updates.

    ``record`` keeps the policy's log of decisions (``SimResult.report``), as a server's
    metrics keep it.  ``shared_host`` (a :class:`SharedHost`): every worker's exchange runs on
    one host's cores, slowed while others compute.

    ``trainer`` (a :class:`~kvstore_ext.virtual_training.VirtualTraining`) rides on the same
    events and trains a real model: ``start(worker, held, at=)`` when a worker reads the weights,
    ``push(worker, server, accepted)`` when its gradient reaches a server, ``apply(server,
    pusher)`` when the policy applies, and ``advance(now)`` before each event (it evaluates,
    and ends the run by returning False).
    """
    row = registry.lookup(store_type)
    if clocks is not None:
        speeds = [1.0] * len(clocks)
    if service < 0 or apply_time < 0:
        raise ValueError(f"service {service} and apply_time {apply_time} must be >= 0")
    if row.policy is None and row.block_policy is not None:
        return simulate_blocks(row, row.check(params), speeds, horizon, base_time, jitter,
                               seed, latency, clocks, release_latency, servers, reply_delays,
                               blocks, trainer, latency_jitter, shared_host, service,
                               apply_time)
    if servers != 1 or any(reply_delays or ()) or blocks:
        raise ValueError(f"{store_type}: servers and reply delays are only simulated for "
                         f"stores with per-block rounds (dist_psp)")
    step_time = iteration_times(speeds, base_time, jitter, seed, clocks)
    overhead = overhead_times(latency, release_latency, latency_jitter, seed)
    host = shared_host.fresh() if shared_host else None
    n = len(speeds)
    policy = registry.make_policy(store_type, range(n), params, record)
    iterations = {w: 0 for w in range(n)}
    wait = {w: 0.0 for w in range(n)}
    pushed_at: dict[int, float] = {}
    events: list[tuple[float, int, int]] = []   # (time a push arrives, tie-break, worker)
    seq = 0
    max_lead, decisions, leads = 0, 0, []
    busy_until = 0.0      # the server is serving pushes until then
    applied = 0           # updates the server has applied
    read_at: dict[int, int] = {}   # worker -> updates applied when it read the weights
    gathered: list[int] = []       # pushes waiting for the next application
    staleness: dict[int, int] = {}

    def start(worker: int, at: float, together: int = 1) -> None:
        nonlocal seq
        seq += 1
        read_at[worker] = applied
        if trainer is not None:
            trainer.start(worker, at=at)
        at += host.exchange(worker, at, overhead(together)) if host else overhead(together)
        heapq.heappush(events, (at + step_time(worker, at), seq, worker))

    # replies held for the pushes queued behind them (an asynchronous store's server, when
    # its queue is modelled; 0: each goes at once): (worker, lead) let go, and since when
    hold = reply_hold if (service or apply_time) and row.asynchronous else 0.0
    held: list[tuple[int, int]] = []
    held_since = 0.0

    def let_go(released, now: float) -> None:
        nonlocal max_lead
        for worker, lead in released:
            max_lead = max(max_lead, lead)
            leads.append(lead)
            wait[worker] += now - pushed_at.get(worker, 0.0)   # a pool's late starter
            start(worker, now, len(released))

    waiting_first = getattr(policy, "parked", set())   # outside a worker pool at the start
    for w in range(n):
        if w not in waiting_first:
            start(w, 0.0, 0)
    while events and events[0][0] <= horizon:
        if trainer is not None and not trainer.advance(events[0][0]):
            break
        now, _, worker = heapq.heappop(events)
        iterations[worker] += 1
        pushed_at[worker] = now
        if trainer is not None:
            trainer.push(worker)
        decision = policy.on_push(worker, now)
        decisions += 1
        if service or apply_time:
            busy_until = max(now, busy_until) + service + (apply_time if decision.apply else 0.0)
            now = busy_until
        gathered.append(worker)
        if decision.apply:
            for pusher in gathered:
                lag = applied - read_at[pusher]
                staleness[lag] = staleness.get(lag, 0) + 1
            gathered.clear()
            applied += 1
        if trainer is not None and decision.apply:
            trainer.apply(0, worker if row.asynchronous else None)
        if decision.released and not held:
            held_since = now
        held.extend(decision.released)
        queued = events and events[0][0] <= min(now, horizon)
        if held and not (queued and now - held_since < hold):
            let_go(held, now)
            held = []
    report = policy.report() if record else {}
    return SimResult(iterations, wait, max_lead, decisions, horizon, leads, staleness=staleness,
                     report=report)


def simulate_blocks(row, params: dict, speeds, horizon: float, base_time: float = 1.0,
                    jitter: float = 0.0, seed: int = 0, latency: float = 0.0,
                    clocks=None, release_latency: float = 0.0, servers: int = 1,
                    reply_delays=None, blocks=None, trainer=None,
                    latency_jitter: float = 0.0, shared_host=None, service: float = 0.0,
                    apply_time: float = 0.0) -> SimResult:
    """The same, for a store whose rounds are versions of a block (``dist_psp``): every
    worker pushes to every server, which holds ``blocks[s]`` blocks (default 1) that move
    together (one policy per server: they get the same pushes).

    A worker pushes each block stamped with the version it holds; the row's block policy
    drops it if the block has moved on, or sums it into the round, which closes after c
    pushes and τ1 more (a timer event), or when every worker has pushed.  The pull that
    follows asks every server for the next version; a server's part reaches the worker
    ``reply_delays[s]`` after the block gets there (a slow server).  The worker goes on once
    a fraction b of the blocks has come and τ2 more has passed, or all have
    (:class:`~kvstore_ext.policies.psp.PartialPull`).  A part that comes after the worker went
    on is written into its weights when it comes, if newer than the version held, as the store
    does (``DistPSP._write_late``); until then the block's pushes are stamped with the old
    version, and dropped if the block moved on.

    The servers have no queue here: their round (a push from each of the n workers,
    ``service`` each, and ``apply_time``) is a delay added to every exchange beside
    ``latency``, jittered with it.  A ``shared_host`` slows only the ``latency`` part: it is the
    worker's own CPU waiting for a core beside the others' compute, the round is the server's
    (slowing the whole by the shared host cost PSP 8% of its iterations at n = 8 against the
    machine, 2026-12-02).
    """
    step_time = iteration_times(speeds, base_time, jitter, seed, clocks)
    n = len(speeds)
    server_round = n * service + apply_time
    overhead = overhead_times(latency + server_round, release_latency, latency_jitter, seed)
    host = shared_host.fresh() if shared_host else None
    on_host = latency / (latency + server_round) if latency + server_round > 0 else 1.0
    delays = list(reply_delays or [0.0] * servers)
    if len(delays) != servers or any(d < 0 for d in delays):
        raise ValueError(f"reply_delays {delays} must give {servers} delays >= 0")
    blocks = list(blocks or [1] * servers)
    if len(blocks) != servers or any(type(k) is not int or k < 1 for k in blocks):
        raise ValueError(f"blocks {blocks} must give {servers} counts >= 1")
    policies = [row.block_policy(range(n), params) for _ in range(servers)]
    iterations = {w: 0 for w in range(n)}
    wait = {w: 0.0 for w in range(n)}
    held = {w: [0] * servers for w in range(n)}    # the version of each block a worker holds
    calls = {w: 0 for w in range(n)}               # each worker's current pull
    waiting: dict[int, dict] = {}   # worker -> {"pushed": t, "asked": {s: version}, "came": set,
    #                                            "pull": PartialPull, "sent": set of servers}
    events: list = []   # (time, tie-break, kind, payload)
    seq = 0
    max_lead, decisions, leads = 0, 0, []
    staleness: dict[int, int] = {}

    def schedule(at: float, kind: str, payload) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, kind, payload))

    def start(worker: int, at: float, together: int = 1) -> None:
        if trainer is not None:
            trainer.start(worker, held[worker], at=at)
        cost = overhead(together)
        at += host.exchange(worker, at, cost * on_host) + cost * (1 - on_host) if host else cost
        schedule(at + step_time(worker, at), "push", worker)

    def send_parts(now: float) -> None:
        """Every server's parts that have reached the versions asked for go out (one event
        per server and moment, so the workers they complete are let go together)."""
        for s, policy in enumerate(policies):
            ready = [(w, calls[w]) for w, st in sorted(waiting.items())
                     if s not in st["sent"] and policy.version >= st["asked"][s]]
            for w, _ in ready:
                waiting[w]["sent"].add(s)
            if ready:
                if delays[s] == 0:
                    arrive(now, s, policy.version, ready)
                else:
                    schedule(now + delays[s], "parts", (s, policy.version, ready))

    released_now: list = []

    def arrive(now: float, s: int, version: int, parts) -> None:
        for w, call in parts:
            held[w][s] = max(held[w][s], version)   # a late part is written when it comes
            st = waiting.get(w)
            if st is None or calls[w] != call:
                continue            # a pull the worker went on without
            st["came"].add(s)
            check(w, now)

    def check(w: int, now: float) -> None:
        st = waiting[w]
        if st["pull"].done(sum(blocks[s] for s in st["came"]), now):
            if w not in released_now:
                released_now.append(w)
        elif st["pull"].wake_at() is not None and not st.get("wake"):
            st["wake"] = True
            schedule(st["pull"].wake_at(), "wake", (w, calls[w]))

    def release(now: float) -> None:
        nonlocal max_lead
        together = len(released_now)
        for w in sorted(released_now):
            st = waiting.pop(w)
            lead = iterations[w] - min(iterations.values())
            max_lead = max(max_lead, lead)
            leads.append(lead)
            wait[w] += now - st["pushed"]
            start(w, now, together)
        released_now.clear()

    for w in range(n):
        start(w, 0.0, 0)
    while events and events[0][0] <= horizon:
        if trainer is not None and not trainer.advance(events[0][0]):
            break
        now, _, kind, payload = heapq.heappop(events)
        if kind == "timer":
            outcome = policies[payload].on_timer(now)
            if trainer is not None and outcome.apply:
                trainer.apply(payload)
            if outcome.deadline is not None:
                schedule(outcome.deadline, "timer", payload)
        elif kind == "push":
            worker = payload
            iterations[worker] += 1
            decisions += 1
            calls[worker] += 1
            for s, policy in enumerate(policies):
                lag = policy.version - held[worker][s]     # 0 unless dropped as late
                outcome = policy.on_push(worker, held[worker][s], now)
                if not outcome.dropped:
                    staleness[lag] = staleness.get(lag, 0) + blocks[s]
                if trainer is not None:
                    trainer.push(worker, s, accepted=not outcome.dropped)
                    if outcome.apply:
                        trainer.apply(s)
                if outcome.deadline is not None:
                    schedule(outcome.deadline, "timer", s)
            waiting[worker] = {"pushed": now, "came": set(), "sent": set(),
                               "asked": {s: held[worker][s] + 1 for s in range(servers)},
                               "pull": PartialPull(sum(blocks),
                                                   params.get("min_pull_fraction", 1.0),
                                                   params.get("pull_timeout", 0.0))}
        elif kind == "parts":
            arrive(now, *payload)
        elif kind == "wake":
            w, call = payload
            if w in waiting and calls[w] == call:
                waiting[w]["wake"] = False
                check(w, now)
        if kind in ("timer", "push"):
            send_parts(now)
        release(now)
    dropped = sum(p.dropped * k for p, k in zip(policies, blocks))   # pushed blocks dropped
    return SimResult(iterations, wait, max_lead, decisions, horizon, leads, dropped, staleness)


def paradigms(stores: list[str] | None = None) -> dict[str, tuple[str, dict]]:
    """label -> (store type, parameters): each registry row's example settings, for every row
    whose servers run a policy the simulator can drive (or the rows named in ``stores``)."""
    def simulated(row):
        return row.policy is not None or row.block_policy is not None
    rows = [registry.lookup(name) for name in stores] if stores else \
        [row for row in registry.STORES.values() if simulated(row)]
    return {label: (row.name, row.check(params)) for row in rows if simulated(row)
            for label, params in row.settings()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvstore_ext.simulate",
        description="Simulate virtual workers under each synchronisation model and print how "
                    "many iterations each gets through (no processes, no training). "
                    "python -m kvstore_ext.simulate --train CONFIG trains an experiment's "
                    "model in virtual time instead (--train CONFIG --help).")
    parser.add_argument("--speeds", default="1.0,0.43",
                        help="comma-separated speed of each worker (1.0 = full speed)")
    parser.add_argument("--time", type=float, default=1000.0,
                        help="simulated time, in units of the fastest worker's iteration")
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="each iteration's time varies uniformly by +- this fraction")
    parser.add_argument("--latency", type=float, default=0.0,
                        help="time from OK to the next iteration's start (the pull)")
    parser.add_argument("--release-latency", type=float, default=0.0,
                        help="more time from OK to start for each worker let go at the same "
                             "moment (k workers of a round pull together: k times this)")
    parser.add_argument("--latency-jitter", type=float, default=0.0,
                        help="each start's latency varies uniformly by +- this fraction "
                             "(0 to 1; a host's push and pull are not constant)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the jitter and patterns")
    parser.add_argument("--workers", type=int, default=0,
                        help="number of workers when one speed or device is given for all")
    parser.add_argument("--device", default="",
                        help="emulated devices instead of --speeds, as launch.py --device takes "
                             "them (e.g. gtx1080ti,gtx1060 or 200ms*8); --time is then seconds")
    parser.add_argument("--device-model", default=None,
                        help="the model device profiles are timed on (launch.py --device-model)")
    parser.add_argument("--device-batch", type=int, default=128,
                        help="the batch size device profiles are timed at (default 128)")
    parser.add_argument("--straggler-pattern", action="append", default=[], metavar="SPEC",
                        help="device slow-downs (repeatable): " + PATTERN_HELP)
    parser.add_argument("--servers", type=int, default=1,
                        help="servers, each holding one block of the model (dist_psp only; "
                             "the per-key policies are simulated as one server)")
    parser.add_argument("--reply-delays", default="",
                        help="comma-separated seconds each server's replies are late, one per "
                             "server (e.g. 0,0,0,1.5: server 3 is slow, as launch.py "
                             "--slow-server 3:1.5); dist_psp only")
    parser.add_argument("--blocks", default="",
                        help="comma-separated number of blocks each server holds (default 1 "
                             "each); b counts blocks (dist_psp only)")
    parser.add_argument("--kv-param", action="append", default=[], metavar="NAME=VALUE",
                        help="a store parameter (JSON value) given to every simulated store "
                             "that takes it, over its example settings, e.g. "
                             "min_pull_fraction=0.75 (repeatable)")
    parser.add_argument("--stores", default="",
                        help="comma-separated store types to simulate (default: every type whose "
                             "servers run a per-key policy, each with its example settings)")
    args = parser.parse_args(argv)
    speeds = [float(v) for v in args.speeds.split(",")]
    if args.straggler_pattern and not args.device:
        parser.error("--straggler-pattern needs --device")
    n = args.workers or (count_devices(args.device) if args.device else len(speeds))

    def clocks():   # fresh ones for every paradigm: a clock's draws advance as it is used
        if not args.device:
            return None
        try:
            return DeviceClock.for_cluster(args.device, args.straggler_pattern, n,
                                           args.device_model, args.device_batch, args.seed)
        except ValueError as exc:
            parser.error(str(exc))
    clocks()
    if not args.device and args.workers and len(speeds) == 1:
        speeds = speeds * n
    print(f"{'paradigm':<12} {'iterations':>10} {'per worker':>18} {'vs BSP':>7} {'max lead':>8} "
          f"{'dropped':>7}")
    base = None
    chosen = [n for n in args.stores.split(",") if n.strip()] or None
    given = {}
    for item in args.kv_param:
        name, eq, value = item.partition("=")
        if not eq:
            parser.error(f"--kv-param expects NAME=VALUE, got {item!r}")
        try:
            given[name] = json.loads(value)
        except json.JSONDecodeError:
            given[name] = value
    try:
        delays = [float(d) for d in args.reply_delays.split(",")] if args.reply_delays else None
    except ValueError:
        parser.error(f"--reply-delays must be numbers of seconds, got {args.reply_delays!r}")
    if delays is not None and len(delays) != args.servers:
        parser.error(f"--reply-delays gives {len(delays)} delays for {args.servers} servers")
    try:
        blocks = [int(k) for k in args.blocks.split(",")] if args.blocks else None
    except ValueError:
        parser.error(f"--blocks must be whole numbers, got {args.blocks!r}")
    per_block = args.servers > 1 or any(delays or ()) or blocks is not None
    for name, (store_type, params) in paradigms(chosen).items():
        row = registry.lookup(store_type)
        if per_block and row.block_policy is None:
            continue    # servers and late replies are modelled for per-block rounds only
        params = {**params, **{k: v for k, v in given.items() if k in row.params}}
        try:
            r = simulate(store_type, params, speeds, args.time, jitter=args.jitter,
                         seed=args.seed, latency=args.latency, clocks=clocks(),
                         release_latency=args.release_latency, servers=args.servers,
                         reply_delays=delays, blocks=blocks, latency_jitter=args.latency_jitter)
        except ValueError as exc:
            parser.error(f"{name}: {exc}")
        base = base or r.total_iterations
        per = ",".join(str(r.iterations[w]) for w in sorted(r.iterations))
        print(f"{name:<12} {r.total_iterations:>10} {per:>18} "
              f"{r.total_iterations / base:>6.2f}x {r.max_lead_at_ok:>8} {r.dropped:>7}")
    return 0

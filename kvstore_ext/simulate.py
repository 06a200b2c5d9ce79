"""A discrete-event simulator: virtual workers driving the very policies the servers run.

Each virtual worker computes for its iteration time, pushes, and starts its
next iteration when the policy gives it OK (under ``dist_psp``: when the block's
round closes, or at once if its push was dropped as late).  Every registry row
with a policy is simulated, with its example settings.  No processes, no arrays: it runs
thousands of workers in seconds, and answers "how many iterations does each
paradigm get through in a given time on this cluster" before any training.

    python -m kvstore_ext.simulate --speeds 1.0,0.43 --time 1000
    python -m kvstore_ext.simulate --device 200ms*8 --straggler-pattern transient:0.05:3:2 --time 60
"""
from __future__ import annotations

import argparse
import heapq
import random
from dataclasses import dataclass, field

from .devices import PATTERN_HELP, DeviceClock, count_devices
from .stragglers import stretched_time
from . import registry


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

    @property
    def total_iterations(self) -> int:
        return sum(self.iterations.values())

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


def simulate(store_type: str, params: dict, speeds, horizon: float, base_time: float = 1.0,
             jitter: float = 0.0, seed: int = 0, latency: float = 0.0, clocks=None,
             release_latency: float = 0.0) -> SimResult:
    """Run virtual workers with the given speeds (or device ``clocks``) until ``horizon``.

    Iteration times as :func:`iteration_times` gives them; ``latency`` is added between
    an OK and the next iteration's start (the pull and the push), plus ``release_latency``
    for each worker released at that same moment: k workers let go together (a BSP round)
    pull and start at once, and share the network and the hosts.
    """
    row = registry.lookup(store_type)
    if clocks is not None:
        speeds = [1.0] * len(clocks)
    if row.policy is None and row.block_policy is not None:
        return simulate_blocks(row, row.check(params), speeds, horizon, base_time, jitter,
                               seed, latency, clocks, release_latency)
    step_time = iteration_times(speeds, base_time, jitter, seed, clocks)
    n = len(speeds)
    policy = registry.make_policy(store_type, range(n), params)
    iterations = {w: 0 for w in range(n)}
    wait = {w: 0.0 for w in range(n)}
    pushed_at: dict[int, float] = {}
    events: list[tuple[float, int, int]] = []   # (time a push arrives, tie-break, worker)
    seq = 0
    max_lead, decisions, leads = 0, 0, []

    def start(worker: int, at: float, together: int = 1) -> None:
        nonlocal seq
        seq += 1
        at += latency + release_latency * together
        heapq.heappush(events, (at + step_time(worker, at), seq, worker))

    for w in range(n):
        start(w, 0.0, 0)
    while events and events[0][0] <= horizon:
        now, _, worker = heapq.heappop(events)
        iterations[worker] += 1
        pushed_at[worker] = now
        decision = policy.on_push(worker, now)
        decisions += 1
        for released, lead in decision.released:
            max_lead = max(max_lead, lead)
            leads.append(lead)
            wait[released] += now - pushed_at[released]
            start(released, now, len(decision.released))
    return SimResult(iterations, wait, max_lead, decisions, horizon, leads)


def simulate_blocks(row, params: dict, speeds, horizon: float, base_time: float = 1.0,
                    jitter: float = 0.0, seed: int = 0, latency: float = 0.0,
                    clocks=None, release_latency: float = 0.0) -> SimResult:
    """The same, for a store whose rounds are versions of a block (``dist_psp``, one block).

    A worker pushes its gradient stamped with the version it holds; the row's block policy
    drops it if the block has moved on, or sums it into the round, which closes after c
    pushes and τ1 more (a timer event), or when every worker has pushed.  The pull that
    follows waits for the next version; then the worker starts its next iteration.
    """
    step_time = iteration_times(speeds, base_time, jitter, seed, clocks)
    n = len(speeds)
    policy = row.block_policy(range(n), params)
    iterations = {w: 0 for w in range(n)}
    wait = {w: 0.0 for w in range(n)}
    held = {w: 0 for w in range(n)}              # the version of the block each worker holds
    waiting: dict[int, tuple[int, float]] = {}   # worker -> (version wanted, pushed at)
    events: list[tuple[float, int, int]] = []    # (time, tie-break, worker; -1 for a timer)
    seq = 0
    max_lead, decisions, leads = 0, 0, []

    def start(worker: int, at: float, together: int = 1) -> None:
        nonlocal seq
        seq += 1
        at += latency + release_latency * together
        heapq.heappush(events, (at + step_time(worker, at), seq, worker))

    def release(now: float) -> None:
        nonlocal max_lead
        together = sum(policy.version >= wanted for wanted, _ in waiting.values())
        for worker, (wanted, pushed_at) in sorted(waiting.items()):
            if policy.version >= wanted:
                del waiting[worker]
                held[worker] = policy.version
                lead = iterations[worker] - min(iterations.values())
                max_lead = max(max_lead, lead)
                leads.append(lead)
                wait[worker] += now - pushed_at
                start(worker, now, together)

    for w in range(n):
        start(w, 0.0, 0)
    while events and events[0][0] <= horizon:
        now, _, worker = heapq.heappop(events)
        if worker < 0:
            outcome = policy.on_timer(now)
        else:
            iterations[worker] += 1
            outcome = policy.on_push(worker, held[worker], now)
            waiting[worker] = (held[worker] + 1, now)
            decisions += 1
        if outcome.deadline is not None:
            seq += 1
            heapq.heappush(events, (outcome.deadline, seq, -1))
        release(now)
    return SimResult(iterations, wait, max_lead, decisions, horizon, leads, policy.dropped)


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
        description="Simulate virtual workers under each synchronisation model and print how "
                    "many iterations each gets through (no processes, no training).")
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
    for name, (store_type, params) in paradigms(chosen).items():
        r = simulate(store_type, params, speeds, args.time, jitter=args.jitter,
                     seed=args.seed, latency=args.latency, clocks=clocks(),
                     release_latency=args.release_latency)
        base = base or r.total_iterations
        per = ",".join(str(r.iterations[w]) for w in sorted(r.iterations))
        print(f"{name:<12} {r.total_iterations:>10} {per:>18} "
              f"{r.total_iterations / base:>6.2f}x {r.max_lead_at_ok:>8} {r.dropped:>7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The performance model: seconds per iteration of a data-parallel job, from calibrated costs.

Yan et al. (KDD 2015) model an iteration as the compute of every layer, slowed by the
interference of the processes sharing a host (their Eq. 9), plus the time to move the weights
to and from the parameter servers, which lies between a best case, where a replica reads every
server in parallel, and a worst case, where all replicas queue at one server (Eq. 10-11).
Their servers were free; here a server is one Python process whose CPU time per message, per
key, per byte and per array in a frame of its own is measured (``calibrate``), so the model
places the queue where it really forms: on the busiest server of the partition MXNet's rule
makes.  It adds the synchronous store (a round waits for the slowest worker, then for the server
to serve every worker's push) and, for every process sharing a host of ``cores`` cores, the
roofline bound (the host cannot do more CPU work per second than it has cores) and the wait for
a core below it: a synchronous round's phases run in every process at once and share the cores,
and an asynchronous worker's CPU work queues behind the others' (an M/M/c response time).

All of it is arithmetic on numpy arrays, so the search evaluates 10^5 configurations at once;
:func:`predict` is the same code on one configuration.  Stores whose pace depends on the policy
with uneven workers (SSP, DSSP, PSP) are handed to the simulator (:func:`simulated_time`),
which drives the real policy objects with these service times and wire delays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..ps.partition import Partitioner
from ..ps.protocol import frames_of, layout

#: stores the closed form covers; the others are simulated
CLOSED_FORM = ("dist_bsp", "dist_asp", "dist_ssp", "dist_dssp", "dist_ssgd", "dist_dcs3gd")
#: the stores whose workers allreduce on Horovod (no servers)
ALLREDUCE = ("dist_ssgd", "dist_dcs3gd")
#: what can bound an iteration, in the order the breakdown lists them
BOTTLENECKS = ("compute", "barrier wait", "worker CPU", "worker link", "server CPU",
               "server link", "host CPU")
BYTES_PER_PARAM = 4
#: the time between a process's rounds from which they cost :attr:`Costs.idle_factor` in full
IDLE_FULL_S = 0.02


@dataclass
class Costs:
    """Calibrated coefficients, in seconds (``calibrate`` measures them; see docs/planner.md).

    The worker's CPU per round is ``worker_msg`` per server message plus ``worker_key`` per key
    plus ``worker_byte`` per gradient byte (reading gradients out of MXNet, planning, sealing,
    opening the reply, writing the weights back).  A server's CPU per push message is
    ``server_msg + server_key * keys + server_byte * bytes + server_frame * frames`` (opening,
    checks, the policy, gathering, the reply; ``frames``: the arrays of
    ``protocol.OWN_FRAME_BYTES`` or more, which travel in frames of their own both ways:
    :meth:`push_seconds`), and per optimizer application ``opt_call + opt_key * keys +
    opt_param * params`` (:meth:`apply_seconds`).  A message crosses a link in
    ``latency + bytes / bandwidth``.  ``interference[k]``
    is the slow-down of one process's compute when k compute at once on one host
    (``horovod_interference[k]`` in the Horovod workers' environment, if measured).  Gloo's
    ring allreduce takes ``allreduce_latency`` per step and ``1 / allreduce_bandwidth`` per
    byte of wall time, and ``allreduce_cpu_latency`` and ``allreduce_cpu_byte`` of a worker's
    CPU.  ``compute_cv[k]`` (``horovod_compute_cv[k]``) is the jitter of one step's compute
    when k compute at once, its standard deviation over its mean; none measured: no jitter.
    ``idle_factor``: a round's runtime CPU (worker and server) when the processes idle
    between rounds, as training does, over back to back, as the runtime jobs measure it
    (:meth:`idle_at`).
    """

    worker_msg: float = 2e-4
    worker_key: float = 2e-5
    worker_byte: float = 2e-9
    server_msg: float = 3e-4
    server_key: float = 3e-5
    server_byte: float = 1e-9
    server_frame: float = 0.0
    opt_call: float = 0.0
    opt_key: float = 2e-5
    opt_param: float = 2e-9
    latency: float = 5e-5
    bandwidth: float = 2e9
    allreduce_latency: float = 2e-4
    allreduce_bandwidth: float = 5e8
    allreduce_cpu_latency: float = 0.0
    allreduce_cpu_byte: float = 0.0
    interference: dict = field(default_factory=lambda: {1: 1.0})
    horovod_interference: dict | None = None
    compute_cv: dict = field(default_factory=dict)
    horovod_compute_cv: dict | None = None
    cores: int = 2
    idle_factor: float = 1.0

    def idle_at(self, between_s):
        """The factor on a parameter-server round's CPU when ``between_s`` seconds (array or
        number) of compute or device time separate a process's rounds: none back to back,
        ``idle_factor`` from :data:`IDLE_FULL_S` on, linear between (measured here: 5 ms
        between rounds cost 1.04-1.12 times, 20-150 ms 1.23-1.40)."""
        gap = np.clip(np.asarray(between_s, dtype=float) / IDLE_FULL_S, 0.0, 1.0)
        return 1.0 + (self.idle_factor - 1.0) * gap

    def apply_seconds(self, keys, params):
        """A server's CPU seconds for one optimizer application to ``keys`` keys of ``params``
        elements in all (arrays or numbers)."""
        return (self.opt_call + self.opt_key * np.asarray(keys, dtype=float)
                + self.opt_param * np.asarray(params, dtype=float))

    def push_seconds(self, keys, nbytes, frames=0, messages=1):
        """A server's CPU seconds for ``messages`` push messages carrying ``keys`` keys (blocks)
        of ``nbytes`` bytes in all, ``frames`` of them in frames of their own (arrays or
        numbers); a calibration made before the per-frame term has none."""
        return (self.server_msg * np.asarray(messages, dtype=float)
                + self.server_key * np.asarray(keys, dtype=float)
                + self.server_byte * np.asarray(nbytes, dtype=float)
                + self.server_frame * np.asarray(frames, dtype=float))

    def interference_at(self, k, horovod=False):
        """Slow-down at ``k`` concurrent processes (array or number): measured points,
        linear between them, and beyond the last one growing as k / cores does.
        ``horovod``: of Horovod workers (their own measurement, if there is one)."""
        table = self.horovod_interference if horovod and self.horovod_interference \
            else self.interference
        ks, fs = _points(table)
        k = np.asarray(k, dtype=float)
        inside = np.interp(k, ks, fs)
        last_k, last_f = ks[-1], fs[-1]
        beyond = last_f * np.maximum(k, 1.0) / last_k
        return np.where(k > last_k, np.maximum(beyond, last_f), inside)

    def compute_cv_at(self, k, horovod=False):
        """The jitter of a step's compute at ``k`` concurrent processes (array or number):
        measured points (k > 1), linear between them, the nearest one's outside them; 0 if
        none measured."""
        table = self.horovod_compute_cv if horovod and self.horovod_compute_cv \
            else self.compute_cv
        k = np.asarray(k, dtype=float)
        if not table:
            return np.zeros_like(k)
        return np.interp(k, *_points(table))

    #: the coefficients that are seconds of CPU (a slower host multiplies them); the two
    #: bandwidths are divided instead, and the interference and jitter, ratios, are kept
    CPU_SECONDS = ("worker_msg", "worker_key", "worker_byte", "server_msg", "server_key",
                   "server_byte", "server_frame", "opt_call", "opt_key", "opt_param", "latency",
                   "allreduce_latency", "allreduce_cpu_latency", "allreduce_cpu_byte")

    def scaled(self, factor: float) -> "Costs":
        """These costs on a host ``factor`` times as slow (1.2: every CPU second takes 1.2):
        what :func:`.validate.host_drift` finds when the host drifts after calibration."""
        changes = {k: getattr(self, k) * factor for k in self.CPU_SECONDS}
        changes.update(bandwidth=self.bandwidth / factor,
                       allreduce_bandwidth=self.allreduce_bandwidth / factor)
        return replace(self, **changes)

    @classmethod
    def from_calibration(cls, data: dict) -> "Costs":
        c = data["coefficients"]
        return cls(**{k: ({int(a): b for a, b in v.items()} if isinstance(v, dict) else v)
                      for k, v in c.items() if k in cls.__dataclass_fields__})

    def to_dict(self) -> dict:
        def plain(v):
            return {str(a): b for a, b in sorted(v.items())} if isinstance(v, dict) else v
        return {k: plain(getattr(self, k)) for k in self.__dataclass_fields__}


def _points(table: dict) -> tuple:
    """A coefficient measured per process count, as sorted arrays ``(counts, values)``."""
    ks = np.array(sorted(int(x) for x in table), dtype=float)
    return ks, np.array([table[int(x)] for x in ks], dtype=float)


_erf = np.frompyfunc(math.erf, 1, 1)


def expected_max(a, b, sigma_a, sigma_b=0.0):
    """E[max(X, Y)] of independent normal X (mean ``a``, deviation ``sigma_a``) and Y (``b``,
    ``sigma_b``), by Clark's formula (1961); arrays broadcast, and with no deviation it is
    ``max(a, b)``.  Two paths that run side by side and vary from step to step end, on
    average, later than the longer of their means: by 0.40 x sqrt(sa^2 + sb^2) when the means
    are equal, less as they part."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    theta = np.hypot(np.asarray(sigma_a, dtype=float), np.asarray(sigma_b, dtype=float))
    safe = np.where(theta > 0, theta, 1.0)
    alpha = (a - b) / safe
    cdf = 0.5 * (1.0 + np.asarray(_erf(alpha / math.sqrt(2.0)), dtype=float))
    pdf = np.exp(-0.5 * alpha * alpha) / math.sqrt(2.0 * math.pi)
    return np.where(theta > 0, a * cdf + b * (1.0 - cdf) + theta * pdf, np.maximum(a, b))


@dataclass
class ModelProfile:
    """What the model needs to know about a network: its trainable arrays (elements each,
    in the order ``gluon.Trainer`` pushes them), and its host compute per iteration,
    ``compute_fixed + compute_per_sample * batch`` seconds (fitted per layer by ``calibrate``)."""

    name: str
    key_sizes: list
    compute_fixed: float = 0.0
    compute_per_sample: float = 0.0
    activation_elements_per_sample: float = 0.0
    layers: list = field(default_factory=list)
    #: the compute line of a Horovod store's worker (MKL-DNN off, one thread), if measured
    horovod_compute_fixed: float | None = None
    horovod_compute_per_sample: float | None = None

    @property
    def params(self) -> int:
        return int(sum(self.key_sizes))

    def memory_bytes(self, batch_size):
        """A worker's training memory: weights, gradients and momentum, and every layer's
        output kept for the backward pass with its gradient."""
        return BYTES_PER_PARAM * (3 * self.params + 2 * self.activation_elements_per_sample
                                  * np.asarray(batch_size, dtype=float))

    @classmethod
    def from_calibration(cls, data: dict, model: str) -> "ModelProfile":
        if model not in data.get("profiles", {}):
            raise ValueError(f"the calibration has no profile of model {model!r} (it has: "
                             f"{', '.join(sorted(data.get('profiles', {})))}); run "
                             f"'plan calibrate --models {model}'")
        return cls(model, **data["profiles"][model])

    def scaled(self, factor: float) -> "ModelProfile":
        """This profile on a host that computes ``factor`` times as slowly."""
        changes = {k: getattr(self, k) * factor for k in
                   ("compute_fixed", "compute_per_sample", "horovod_compute_fixed",
                    "horovod_compute_per_sample") if getattr(self, k) is not None}
        return replace(self, **changes)

    def host_time(self, batch_size, store=None):
        """The host's compute per iteration at ``batch_size``; for ``store`` (one or an array)
        among the Horovod stores, in their workers' environment when it was measured."""
        b = np.asarray(batch_size, dtype=float)
        line = self.compute_fixed + self.compute_per_sample * b
        if store is not None and self.horovod_compute_per_sample is not None:
            horovod = self.horovod_compute_fixed + self.horovod_compute_per_sample * b
            line = np.where(np.isin(store, ALLREDUCE), horovod, line)
        return np.maximum(line, 0.0)

    def placement(self, servers: int,
                  bigarray_bound: int = 1_000_000) -> list[tuple[int, int, int]]:
        """``(items, elements, frames)`` each server holds, as the workers' partitioner places
        them: small keys whole on ``key % servers``, keys of ``bigarray_bound`` elements or
        more cut across every server; ``frames``: the frames a worker's push to it travels in
        besides frame 0 (:func:`staged_frames`)."""
        part = Partitioner(servers, bigarray_bound)
        held = [[0, 0, []] for _ in range(servers)]
        for key, size in enumerate(self.key_sizes):
            for block in part.blocks(key, int(size)):
                held[block.server][0] += 1
                held[block.server][1] += block.size
                held[block.server][2].append(block)
        frames = staged_frames([h[2] for h in held])
        return [(h[0], h[1], f) for h, f in zip(held, frames)]


def staged_frames(blocks_by_server) -> list[int]:
    """The frames (besides frame 0) of a worker's push to each server: a worker stages each
    key whole, in key order (``protocol.layout``), in its buffer for the server of the key's
    first block, a server's blocks are slices of them, and ``transport.pack`` sends blocks that
    lie back to back with ``protocol.OWN_FRAME_BYTES`` or more together as one frame, a larger
    block alone as one (``protocol.frames_of``).  Keys whose sizes are multiples of 8 bytes,
    none cut across servers: one frame per server."""
    lane, elements = {}, {}         # key -> the server of its first block; its elements
    for b in (b for blocks in blocks_by_server for b in blocks):
        if b.index == 0:
            lane[b.key] = b.server
        elements[b.key] = max(elements.get(b.key, 0), b.stop)
    staged: dict[int, int] = {}     # server -> bytes in its buffer so far
    where: dict = {}                # key -> (its buffer, its offset there)
    for k in sorted(lane, key=_key_order):
        offset = layout([staged.get(lane[k], 0)])[1]     # the next aligned offset
        where[k] = (lane[k], offset)
        staged[lane[k]] = offset + BYTES_PER_PARAM * elements[k]
    frames = []
    for blocks in blocks_by_server:
        places = []
        for b in blocks:
            lane, offset = where[b.key]
            places.append((lane << 48 | offset + BYTES_PER_PARAM * b.start,
                           BYTES_PER_PARAM * b.size, BYTES_PER_PARAM))
        frames.append(frames_of(places))
    return frames


def _key_order(key):
    return (1, str(key)) if isinstance(key, str) else (0, key)


def busiest(profile: ModelProfile, servers: int, costs: Costs, workers: int,
            bigarray_bound: int = 1_000_000) -> dict:
    """The server with the most CPU per round (one push message from each of ``workers``):
    its ``keys`` (items), ``elements`` and own ``frames``; how many servers get a message from
    each worker (``messages``), the most elements on one server, and the items and own frames
    on all (``items``, ``all_frames``: a key cut across servers counts once per block)."""
    held = profile.placement(servers, bigarray_bound)
    used = [h for h in held if h[0]]

    def load(h):
        return workers * costs.push_seconds(h[0], BYTES_PER_PARAM * h[1], h[2])
    keys, elements, frames = max(used, key=load)
    return {"keys": keys, "elements": elements, "frames": frames, "messages": len(used),
            "max_elements": max(h[1] for h in used), "items": sum(h[0] for h in used),
            "all_frames": sum(h[2] for h in used)}


def placement_inputs(place: dict) -> dict:
    """:func:`iteration_time`'s arguments that :func:`busiest`'s placement gives."""
    return dict(keys=place["items"], messages=place["messages"], server_keys=place["keys"],
                server_elements=place["elements"], server_max_elements=place["max_elements"],
                server_frames=place["frames"], frames=place["all_frames"])


def iteration_time(*, store, workers, batch_size, host_s, device_s, keys, elements,
                   messages, server_keys, server_elements, server_max_elements, costs: Costs,
                   server_frames=0, frames=0, device_max_s=None, shared_host=True,
                   bandwidth=None, overlap=1.0, colocated=False, wire_s=0.0):
    """Seconds per iteration of one worker, and the time of each part, for arrays of
    configurations (numpy broadcasting; scalars work).

    ``host_s``: the host's compute per iteration alone; ``device_s``: the device's time (0 when
    the host computes; ``device_max_s`` the slowest worker's, for BSP's barrier).  ``keys`` and
    ``elements`` are the model's, ``server_*`` the busiest server's share, ``messages`` the
    servers a worker sends to, ``frames`` the arrays of a worker's push that travel in frames
    of their own (on all servers; ``server_frames`` on the busiest).  ``shared_host``: every
    process on one host of ``costs.cores`` (this machine); otherwise each worker and server has
    its own host, or with ``colocated`` the servers share the workers' hosts (a server's CPU
    then bounds its host's).  ``wire_s``:
    seconds a worker's exchange spends on a slow link per iteration beyond the calibrated one,
    without CPU (what ``KVX_SIM_COMM_S`` emulates).  Returns ``(seconds, parts)``
    where ``parts`` maps each of :data:`BOTTLENECKS` to an array of seconds on the iteration's
    path: they add up to ``seconds``.
    """
    n = np.asarray(workers, dtype=float)
    bw = costs.bandwidth if bandwidth is None else bandwidth
    nbytes = BYTES_PER_PARAM * np.asarray(elements, dtype=float)
    sbytes = BYTES_PER_PARAM * np.asarray(server_elements, dtype=float)
    smax_bytes = BYTES_PER_PARAM * np.asarray(server_max_elements, dtype=float)
    store = np.asarray(store)
    sync = np.isin(store, ("dist_bsp", "dist_psp"))
    allreduce = np.isin(store, ALLREDUCE)
    # on one shared host, the compute of n workers is slowed by C_interf(n) (the paper's Eq. 9)
    contention = np.where(allreduce, costs.interference_at(n, horovod=True),
                          costs.interference_at(n)) if shared_host else np.ones_like(n)
    host = np.asarray(host_s, dtype=float) * contention
    device = np.asarray(device_s, dtype=float)
    compute = np.maximum(host, device)
    slowest = compute if device_max_s is None else np.maximum(host, device_max_s)
    # a parameter-server round after the compute or the device's time costs more CPU than the
    # calibration's back-to-back rounds (Costs.idle_at); the Horovod stores' costs are their own
    cold = np.where(allreduce, 1.0, costs.idle_at(compute))
    worker_cpu = cold * (costs.worker_msg * np.asarray(messages)
                         + costs.worker_key * np.asarray(keys) + costs.worker_byte * nbytes)
    wire = np.asarray(wire_s, dtype=float)
    link = 2 * costs.latency + 2 * smax_bytes / bw + wire
    push_cpu = cold * costs.push_seconds(server_keys, sbytes, server_frames)
    apply_cpu = cold * costs.apply_seconds(server_keys, server_elements)
    zero = np.zeros(np.broadcast(n, compute, worker_cpu, push_cpu).shape)
    parts = {name: zero.copy() for name in BOTTLENECKS}

    # a synchronous round: the slowest worker, then every worker's push served on the
    # busiest server, one optimizer application, the replies
    server_round = n * push_cpu + apply_cpu
    server_link = 2 * n * sbytes / bw
    # on one shared host a synchronous round's phases run in every process at once: the n
    # workers' CPU work shares the cores, then the servers' rounds do, side by side
    lockstep = np.where(shared_host, np.maximum(1.0, n / costs.cores), 1.0)
    side_by_side = np.where(shared_host, np.maximum(1.0, np.asarray(messages) / costs.cores), 1.0)
    sync_time = slowest + worker_cpu * lockstep + link + np.maximum(server_round * side_by_side,
                                                                    server_link)
    # an asynchronous worker: its own push served and applied; the servers cap the job's rate
    # at one push per (push + apply) on the busiest server, or per its link's transfer
    own = compute + worker_cpu + link + push_cpu + apply_cpu
    async_cap = n * np.maximum(push_cpu + apply_cpu, 2 * sbytes / bw)
    async_time = np.maximum(own, async_cap)
    # allreduce (Gloo's ring): 2(n-1) steps, each moving 1/n of the bytes; DC-S3GD overlaps it
    # with the next iteration's compute (``overlap`` = the share hidden)
    ring = np.where(n > 1, 2 * (n - 1) * costs.allreduce_latency
                    + 2 * (n - 1) / n * nbytes / costs.allreduce_bandwidth + wire, 0.0)
    # ... and takes CPU: DC-S3GD hides its wall time, not the cores it needs (the roofline)
    ring_cpu = np.where(n > 1, 2 * (n - 1) * costs.allreduce_cpu_latency
                        + 2 * (n - 1) / n * nbytes * costs.allreduce_cpu_byte, 0.0)
    hidden = np.where(store == "dist_dcs3gd", overlap, 0.0)
    # the hidden share of the compute and the ring run side by side: the step waits for the
    # later of the two, and a compute that varies from step to step (the calibrated jitter of
    # its CPU part, in the Horovod workers' environment: only dist_dcs3gd hides anything)
    # makes that later on average than the longer mean (Clark's expected max)
    jitter = np.where(shared_host, host * costs.compute_cv_at(n, horovod=True), 0.0)
    side_by_side_ring = expected_max(hidden * slowest, ring, hidden * jitter)
    exposed_ring = side_by_side_ring - hidden * slowest
    ar_time = slowest + worker_cpu * lockstep + exposed_ring
    seconds = np.where(sync, sync_time, np.where(allreduce, ar_time, async_time))

    # one host's cores: every process's CPU in the time of one iteration of each worker
    # (all servers together: every key is on one of them, a message goes to each that holds some)
    all_push = cold * n * costs.push_seconds(keys, nbytes, frames, messages)
    all_apply = cold * costs.apply_seconds(keys, elements)
    server_cpu = np.where(allreduce, 0.0, all_push + np.where(sync, 1.0, n) * all_apply)
    own_ring = np.where(allreduce, ring_cpu, 0.0)
    cpu = n * (np.asarray(host_s, dtype=float) + worker_cpu + own_ring) + server_cpu
    # what sharing costs beyond the cores' count (switches, caches): C_interf(n) x cores / n
    efficiency = np.maximum(contention * costs.cores / np.maximum(n, 1.0), 1.0)
    host_bound = np.where(shared_host, cpu * efficiency / costs.cores, 0.0)
    on_host = np.asarray(host_s, dtype=float) + worker_cpu + np.where(
        allreduce, ring_cpu, np.where(sync, server_round, n * (push_cpu + apply_cpu)))
    host_bound = np.maximum(host_bound, np.where(np.logical_and(colocated, np.logical_not(shared_host)),
                                                 on_host / costs.cores, 0.0))
    unqueued = seconds
    seconds = np.maximum(seconds, host_bound)
    # ... and below that bound, an asynchronous worker's CPU work (its own, then its push on
    # the server) waits for a core as in a queue, at the times the others' work happens to
    # fall: stretched by the M/M/c response time at the utilisation of the host by the other
    # processes (what a worker arriving at the cores finds: the arrival theorem of closed
    # systems), which itself depends on the iteration's length (a fixed point)
    path_cpu = np.where(sync | allreduce, 0.0, worker_cpu + push_cpu + apply_cpu)
    own_cpu = np.asarray(host_s, dtype=float) + worker_cpu + push_cpu + apply_cpu
    others_cpu = np.where(shared_host, cpu, np.where(colocated, on_host, 0.0)) - own_cpu
    for _ in range(QUEUE_STEPS):
        utilisation = np.clip(others_cpu / (costs.cores * seconds), 0.0, MAX_UTILISATION)
        seconds = np.maximum(unqueued + (queue_stretch(utilisation, costs.cores) - 1.0) * path_cpu,
                             host_bound)

    # the breakdown: each part's time on the iteration's path, so that the parts add up to it
    cpu_bound_srv = push_cpu + apply_cpu >= 2 * sbytes / bw
    async_wait = np.maximum(async_time - own, 0.0)          # queueing at the busiest server
    parts["compute"] = zero + compute
    parts["barrier wait"] = zero + np.where(sync | allreduce, slowest - compute, 0.0)
    parts["worker CPU"] = zero + worker_cpu
    parts["worker link"] = zero + np.where(allreduce, exposed_ring, link)
    parts["server CPU"] = zero + np.where(
        allreduce, 0.0, np.where(sync, np.where(server_round >= server_link, server_round, 0.0),
                                 push_cpu + apply_cpu + np.where(cpu_bound_srv, async_wait, 0.0)))
    parts["server link"] = zero + np.where(
        allreduce, 0.0, np.where(sync, np.where(server_round >= server_link, 0.0, server_link),
                                 np.where(cpu_bound_srv, 0.0, async_wait)))
    on_path = sum(parts[k] for k in BOTTLENECKS if k != "host CPU")
    parts["host CPU"] = np.maximum(seconds - on_path, 0.0)   # waiting for this host's cores
    return seconds, parts


#: fixed-point steps of the queueing stretch (each moves less than the last; 20 settle it to
#: well under 0.1% here) and the utilisation it is capped at (the roofline bounds the rest)
QUEUE_STEPS = 20
MAX_UTILISATION = 0.95


def queue_stretch(utilisation, cores: int):
    """Response time over service time of an M/M/c queue (Erlang C) with ``cores`` servers at
    ``utilisation`` (array or number): the factor by which CPU work on a worker's path grows
    when the host's cores are busy that share of the time with other processes' work
    (1/(1 - u^2) for two cores)."""
    u = np.asarray(utilisation, dtype=float)
    c = int(cores)
    a = c * u
    term, below = np.ones_like(a), np.zeros_like(a)
    for k in range(c):
        below = below + term
        term = term * a / (k + 1)
    waiting = term / (1.0 - u)
    erlang_c = waiting / (below + waiting)
    return 1.0 + erlang_c / (c * (1.0 - u))


def bottleneck(parts: dict, index=()) -> str:
    """The part that takes the most time of the iteration ``index`` names."""
    return max(BOTTLENECKS, key=lambda name: float(np.asarray(parts[name])[index]))


@dataclass
class Prediction:
    seconds: float                 # per iteration, of one worker (the job's mean)
    samples_per_s: float           # of the whole job
    epoch_s: float | None          # for ``dataset_size`` samples
    parts: dict
    bottleneck: str
    method: str = "closed form"    # or "simulator"
    run: object = None             # the simulator's SimResult (its staleness, its drops)

    def to_dict(self) -> dict:
        return {"seconds_per_iteration": self.seconds, "samples_per_s": self.samples_per_s,
                "epoch_s": self.epoch_s, "bottleneck": self.bottleneck, "method": self.method,
                "parts": {k: float(v) for k, v in self.parts.items()}}


def predict(profile: ModelProfile, costs: Costs, *, store: str = "dist_bsp", workers: int = 1,
            servers: int = 1, batch_size: int = 64, device_s=0.0, bigarray_bound: int = 1_000_000,
            shared_host: bool = True, bandwidth: float | None = None, dataset_size: int | None = None,
            params: dict | None = None, overlap: float = 1.0, horizon_iterations: int = 400,
            seed: int = 0, host_compute: bool = True, colocated: bool = False,
            wire_s: float = 0.0) -> Prediction:
    """Time per iteration, samples/s and epoch time of one configuration.

    ``device_s`` is one device time for every worker or one per worker (seconds per iteration
    at ``batch_size``; 0: the host computes).  Uneven devices under SSP, DSSP or PSP go to the
    simulator with the closed form's per-part times as its service times and delays.
    ``host_compute``: the host computes the gradients (this machine, where devices are
    emulated on top); False for real accelerators, whose hosts only feed them.
    """
    devices = [float(device_s)] * workers if np.isscalar(device_s) else [float(d) for d in device_s]
    if len(devices) != workers:
        raise ValueError(f"device_s gives {len(devices)} device times for {workers} workers")
    if store not in CLOSED_FORM + ("dist_psp",):
        raise ValueError(f"the model has no equations for store {store!r} "
                         f"(it covers {', '.join(CLOSED_FORM + ('dist_psp',))})")
    place = busiest(profile, servers, costs, workers, bigarray_bound)
    host = float(profile.host_time(batch_size, store)) if host_compute else 0.0
    uneven = len(set(devices)) > 1
    common = dict(workers=workers, batch_size=batch_size, host_s=host, elements=profile.params,
                  **placement_inputs(place), costs=costs, shared_host=shared_host, bandwidth=bandwidth, overlap=overlap,
                  colocated=colocated, wire_s=wire_s)
    method, run = "closed form", None
    if store == "dist_asp" and uneven:
        # every worker at its own pace: the job's rate is the sum of the workers' rates
        own = [iteration_time(store=store, device_s=d, **common)[0] for d in devices]
        rate = sum(1.0 / float(t) for t in own)
        seconds_arr, parts = iteration_time(store=store, device_s=float(np.mean(devices)), **common)
        # ... and the busiest server serves one push (and its apply) at a time
        cap = workers * max(float(parts["server CPU"]), float(parts["server link"]))
        seconds = max(workers / rate, cap)
    elif store in ("dist_ssp", "dist_dssp", "dist_psp") and (uneven or store == "dist_psp"):
        seconds_arr, parts = iteration_time(
            store="dist_bsp" if store == "dist_psp" else "dist_asp",
            device_s=float(np.mean(devices)), device_max_s=max(devices), **common)
        push_s, apply_s = server_service(costs, place, costs.idle_at(parts["compute"]))
        seconds, run = simulated_run(store, params or {}, devices, host,
                                     parts["worker CPU"] + parts["worker link"], push_s, apply_s,
                                     workers, horizon_iterations, seed, costs, shared_host)
        method = "simulator"
    else:
        seconds_arr, parts = iteration_time(store=store, device_s=float(np.mean(devices)),
                                            device_max_s=max(devices), **common)
        seconds = float(seconds_arr)
    samples = workers * batch_size / seconds
    return Prediction(seconds, samples, dataset_size / samples if dataset_size else None,
                      {k: float(v) for k, v in parts.items()}, bottleneck(parts), method, run)


def server_service(costs: Costs, place: dict, cold=1.0) -> tuple[float, float]:
    """The busiest server's CPU seconds per push message, and per optimizer application;
    ``cold``: :meth:`Costs.idle_at` of the time between its rounds (as
    :func:`iteration_time` takes it)."""
    keys, elements = place["keys"], place["elements"]
    return (cold * costs.push_seconds(keys, BYTES_PER_PARAM * np.asarray(elements, dtype=float),
                                      place.get("frames", 0)),
            cold * costs.apply_seconds(keys, elements))


def simulated_time(*args, **kwargs) -> float:
    """:func:`simulated_run`'s seconds per iteration."""
    return simulated_run(*args, **kwargs)[0]


def simulated_run(store: str, params: dict, devices, host: float, comm: float, push_s: float,
                  apply_s: float, workers: int, horizon_iterations: int, seed: int, costs: Costs,
                  shared_host: bool) -> tuple:
    """Mean seconds per iteration from the discrete-event simulator, and its run (a
    ``SimResult``: staleness, drops), whose workers compute for their device's time (or the
    host's, slowed by the others computing), then spend ``comm`` (their CPU and the link), and
    whose server serves pushes one at a time for ``push_s`` each, plus ``apply_s`` when the
    policy applies (``simulate``'s ``service`` and ``apply_time``).
    ``dist_psp``'s per-block rounds are simulated with the server's round as a delay."""
    from .. import registry
    from ..simulate import simulate
    params = registry.lookup(store).check(dict(params or {}))   # the store's defaults filled in
    conc = workers if shared_host else 1
    host_slow = host * float(costs.interference_at(conc))
    times = [max(d, host_slow) for d in devices]
    fastest = min(times)
    horizon = horizon_iterations * (max(times) + comm + (push_s + apply_s) * workers)
    # replies at once (reply_hold=0), as the closed form has them: a server's hold of replies
    # for the pushes queued behind them is not in the model yet, and with it the two part by
    # up to 21% at dist_asp's knee (2026-11-29)
    r = simulate(store, params, [fastest / t for t in times], horizon, base_time=fastest,
                 seed=seed, reply_hold=0.0,
                 **simulator_delays(comm, push_s, apply_s))
    return workers * horizon / max(r.total_iterations, 1), r


def simulator_delays(comm: float, push_s: float, apply_s: float) -> dict:
    """The simulator's ``latency``, ``service`` and ``apply_time`` for a worker's exchange of
    ``comm`` seconds (its CPU and the link) and a server that spends ``push_s`` per push and
    ``apply_s`` per application (``dist_psp``'s per-block rounds take the server's round, a
    push from every worker and the application, as a delay: no queue is simulated there)."""
    return {"latency": comm, "service": push_s, "apply_time": apply_s}


def message_delays(calibration: dict, model: str, store: str, workers: int, servers: int = 1,
                   batch_size: int = 64, bigarray_bound: int = 1_000_000) -> dict:
    """:func:`simulator_delays` of a job of ``model`` on this calibration's machine (every
    process on one host, as the calibration measured them): what virtual-time training adds
    per message when a cluster asks for the planner's costs."""
    costs = Costs.from_calibration(calibration)
    profile = ModelProfile.from_calibration(calibration, model)
    place = busiest(profile, servers, costs, workers, bigarray_bound)
    _, parts = iteration_time(
        store="dist_bsp" if store == "dist_psp" else "dist_asp", workers=workers,
        batch_size=batch_size, host_s=0.0, device_s=0.0, elements=profile.params,
        **placement_inputs(place), costs=costs)
    push_s, apply_s = server_service(costs, place)
    return simulator_delays(float(parts["worker CPU"] + parts["worker link"]), push_s, apply_s)


def epoch_seconds(samples_per_s: float, dataset_size: int) -> float:
    return dataset_size / samples_per_s if samples_per_s > 0 else math.inf

"""Emulated devices: how long each iteration of each worker takes on the device it stands for.

A worker computes its real gradient on the host, then waits until the iteration's *device
time* has passed, so an iteration lasts ``max(host time, device time)``.  Unlike a stretch of
the measured compute, this does not depend on what else the host's cores are doing while
the device is the slower of the two, so 8 emulated GPUs on 2 cores behave like 8 GPUs.

Device times come from a profile (a device and a model give milliseconds per batch, see
:data:`DEVICES` and :data:`MODELS`) or are given directly (``"150ms"``).  Patterns make
them vary in time, reproducibly by seed: per-iteration jitter, transient stragglers, a
rotating slowest worker, a slow period.  :class:`DeviceClock` is pure (no sleeping, no
clock reading): the training loop (``gluon_trainers.EmulatedDevice``) and the simulator
(:mod:`kvstore_ext.simulate`) ask it for the same sequence of times.

    clock = DeviceClock.from_specs("gtx1060", ["transient:0.05:3:2"], rank=1, num_workers=8,
                                   model="cifar_resnet110_v1", batch_size=128, seed=7)
    seconds = clock.next_time(now)   # the device time of the iteration starting at ``now``
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    """A GPU by its peak FP32 throughput (NVIDIA's published figure, at boost clock)."""

    label: str
    peak_tflops: float
    source: str


#: the papers' devices (DSSP: GTX 1080 Ti + GTX 1060 pair, P100 cluster) and common peers
DEVICES = {
    "gtx1080ti": Device("GTX 1080 Ti", 11.34, "NVIDIA spec: 3584 CUDA cores x 1582 MHz x 2"),
    "gtx1080": Device("GTX 1080", 8.87, "NVIDIA spec: 2560 CUDA cores x 1733 MHz x 2"),
    "gtx1060": Device("GTX 1060 6GB", 4.37, "NVIDIA spec: 1280 CUDA cores x 1708 MHz x 2"),
    "p100": Device("Tesla P100 PCIe", 9.3, "NVIDIA P100 datasheet (PCIe, boost)"),
    "v100": Device("Tesla V100 SXM2", 15.7, "NVIDIA V100 datasheet (SXM2, boost)"),
    "k80": Device("Tesla K80 (one GK210)", 4.37, "NVIDIA K80 datasheet: 8.73 per board of two"),
}

#: forward multiply-accumulates per sample, counted by ``gluon_trainers.models.forward_macs``
#: on the model's real layer shapes (the unit tests recount the small ones); name -> (MACs, input)
MODELS = {
    "lenet": (2_293_000, "1x28x28"),
    "alexnet_small": (3_350_272, "1x28x28"),
    "alexnet_small_cifar": (5_229_056, "3x32x32"),     # the DSSP paper's downsized AlexNet
    "cifar_resnet20_v1": (40_818_944, "3x32x32"),
    "cifar_resnet50_v1": (111_597_824, "3x32x32"),     # the DSSP paper's ResNet-50 (CIFAR-100)
    "cifar_resnet56_v1": (125_753_600, "3x32x32"),
    "cifar_resnet110_v1": (253_155_584, "3x32x32"),    # the DSSP paper's ResNet-110 (CIFAR-100)
}

#: fraction of peak FP32 a CIFAR-sized convolutional network reaches in training (an
#: assumption, stated: cuDNN on small 32x32 feature maps runs well below peak). It scales
#: every device alike, so ratios between devices are the ratios of their peaks.
EFFICIENCY = 0.3
#: training = forward + backward, the backward pass costing about twice the forward
TRAIN_FLOPS_PER_MAC = 2 * 3


def device_key(name: str) -> str:
    """The :data:`DEVICES` key of a device name written loosely (``GTX-1080 Ti``), or an error."""
    key = name.strip().lower().replace("-", "").replace("_", "").replace(" ", "")
    if key not in DEVICES:
        raise ValueError(f"unknown device {name!r} (known: {', '.join(sorted(DEVICES))}; "
                         f"or give a time such as 150ms)")
    return key


def profile_ms(device: str, model: str, batch_size: int) -> float:
    """Milliseconds per training batch of ``model`` on ``device``:
    ``MACs x 6 x batch / (peak x EFFICIENCY)``."""
    key = device_key(device)
    if model not in MODELS:
        raise ValueError(f"no profile for model {model!r} (known: {', '.join(sorted(MODELS))})")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"device batch size must be an integer >= 1, got {batch_size!r}")
    flops = MODELS[model][0] * TRAIN_FLOPS_PER_MAC * batch_size
    return flops / (DEVICES[key].peak_tflops * 1e12 * EFFICIENCY) * 1e3


_MS = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*ms\s*$", re.IGNORECASE)


def device_entries(text: str) -> list[tuple[str, int]]:
    """``(device, workers)`` for each entry of ``"gtx1080ti*7,150ms"``: the list's syntax alone."""
    entries = []
    for part in str(text).split(","):
        part = part.strip()
        spec, _, count = part.partition("*")
        try:
            repeat = int(count) if count else 1
        except ValueError:
            raise ValueError(f"device {part!r}: the count after '*' must be an integer") from None
        if repeat < 1:
            raise ValueError(f"device {part!r}: the count after '*' must be >= 1")
        if not spec.strip():
            raise ValueError(f"empty device in {text!r}")
        entries.append((spec.strip(), repeat))
    return entries


def count_devices(text: str) -> int:
    """How many workers a device list names (``NAME*k`` counts k)."""
    return sum(repeat for _, repeat in device_entries(text))


def parse_devices(text: str, num_workers: int, model: str | None = None,
                  batch_size: int = 128) -> list[float]:
    """Seconds per iteration of each worker from ``"gtx1080ti,gtx1060"``, ``"150ms,400ms"``,
    or ``"gtx1080ti*7,gtx1060"`` (``*k``: k workers); one entry applies to all."""
    times = []
    for spec, repeat in device_entries(text):
        match = _MS.match(spec)
        if match:
            ms = float(match.group(1))
            if not ms > 0:
                raise ValueError(f"device time {spec!r} must be more than 0 ms")
        else:
            device_key(spec)
            if model is None:
                raise ValueError(f"device {spec!r} needs a model to time (--device-model, "
                                 f"one of {', '.join(sorted(MODELS))}), or give a time "
                                 f"such as 150ms")
            ms = profile_ms(spec, model, batch_size)
        times += [ms / 1e3] * repeat
    if len(times) == 1:
        times *= num_workers
    if len(times) != num_workers:
        raise ValueError(f"{len(times)} devices given ({text!r}) for {num_workers} workers; "
                         f"give one per worker (NAME*k repeats) or one for all")
    return times


# -- patterns ------------------------------------------------------------------------------------
class Pattern:
    """A time-varying slow-down of one worker: ``factor(iteration, t)`` multiplies its device
    time (``t``: seconds since training started).  Each worker holds its own instance, whose
    random draws come from ``(seed, worker, pattern)`` and advance once per iteration."""

    spec = ""

    def factor(self, iteration: int, t: float) -> float:
        raise NotImplementedError


class Jitter(Pattern):
    """``jitter:J``: every iteration times a uniform draw from [1 - J, 1 + J]."""

    def __init__(self, rng: random.Random, amount: float):
        if not 0 <= amount < 1:
            raise ValueError(f"jitter must be in [0, 1), got {amount}")
        self.rng, self.amount = rng, amount

    def factor(self, iteration, t):
        return 1.0 + self.rng.uniform(-self.amount, self.amount)


class Transient(Pattern):
    """``transient:P:F:S``: at each iteration a worker that is not slowed becomes slowed, with
    probability P, by the factor F for S seconds (another job on its GPU, a thermal throttle)."""

    def __init__(self, rng: random.Random, probability: float, slowdown: float, seconds: float):
        if not 0 <= probability <= 1:
            raise ValueError(f"transient probability must be in [0, 1], got {probability}")
        _check_slowdown(slowdown)
        if not seconds > 0:
            raise ValueError(f"transient length must be > 0 seconds, got {seconds}")
        self.rng, self.p, self.slowdown, self.seconds = rng, probability, slowdown, seconds
        self.until = -1.0

    def factor(self, iteration, t):
        draw = self.rng.random()          # drawn every iteration: the sequence depends on seed only
        if t < self.until:
            return self.slowdown
        if draw < self.p:
            self.until = t + self.seconds
            return self.slowdown
        return 1.0


class Rotating(Pattern):
    """``rotate:F:S``: one worker at a time is slowed by F, worker k during the k-th period of
    S seconds (k modulo the number of workers)."""

    def __init__(self, rank: int, num_workers: int, slowdown: float, seconds: float):
        _check_slowdown(slowdown)
        if not seconds > 0:
            raise ValueError(f"rotation period must be > 0 seconds, got {seconds}")
        self.rank, self.n, self.slowdown, self.seconds = rank, num_workers, slowdown, seconds

    def factor(self, iteration, t):
        return self.slowdown if int(t // self.seconds) % self.n == self.rank else 1.0


class SlowPeriod(Pattern):
    """``slow:F:START:END[:W+W...]``: between START and END seconds the listed workers (all by
    default) are slowed by F."""

    def __init__(self, rank: int, slowdown: float, start: float, end: float,
                 workers: set[int] | None = None):
        _check_slowdown(slowdown)
        if not 0 <= start < end:
            raise ValueError(f"slow period needs 0 <= START < END, got {start}..{end}")
        self.applies = workers is None or rank in workers
        self.slowdown, self.start, self.end = slowdown, start, end

    def factor(self, iteration, t):
        return self.slowdown if self.applies and self.start <= t < self.end else 1.0


def _check_slowdown(value: float) -> None:
    if not value >= 1:
        raise ValueError(f"slow-down factor must be >= 1 (2 = twice as slow), got {value}")


PATTERN_HELP = ("jitter:J (each iteration x U[1-J, 1+J]); transient:P:F:S (each iteration, with "
                "probability P, a worker becomes F times slower for S seconds); rotate:F:S (worker "
                "k is F times slower during the k-th period of S seconds, in turn); "
                "slow:F:START:END[:W+W] (workers W, default all, F times slower from START to END s)")


def parse_pattern(spec: str, rank: int, num_workers: int, seed: int, index: int = 0) -> Pattern:
    """One pattern for worker ``rank`` from its text form (see :data:`PATTERN_HELP`)."""
    kind, *fields = [f.strip() for f in str(spec).split(":")]
    shapes = {"jitter": 1, "transient": 3, "rotate": 2, "slow": (3, 4)}
    if kind not in shapes:
        raise ValueError(f"unknown straggler pattern {spec!r}; patterns: {PATTERN_HELP}")
    want = shapes[kind]
    if len(fields) not in (want if isinstance(want, tuple) else (want,)):
        raise ValueError(f"straggler pattern {spec!r} has {len(fields)} fields; {PATTERN_HELP}")
    workers = None
    if kind == "slow" and len(fields) == 4:
        try:
            workers = {int(w) for w in fields.pop().split("+")}
        except ValueError:
            raise ValueError(f"straggler pattern {spec!r}: workers must be ranks joined by '+'") \
                from None
        bad = sorted(w for w in workers if not 0 <= w < num_workers)
        if bad:
            raise ValueError(f"straggler pattern {spec!r}: no worker {bad[0]} in a job of "
                             f"{num_workers}")
    try:
        values = [float(f) for f in fields]
    except ValueError:
        raise ValueError(f"straggler pattern {spec!r}: every field must be a number") from None
    rng = random.Random(f"{seed}:{rank}:{index}:{kind}")
    try:
        if kind == "jitter":
            return Jitter(rng, *values)
        if kind == "transient":
            return Transient(rng, *values)
        if kind == "rotate":
            return Rotating(rank, num_workers, *values)
        return SlowPeriod(rank, *values, workers=workers)
    except ValueError as exc:
        raise ValueError(f"straggler pattern {spec!r}: {exc}") from None


class DeviceClock:
    """The device time of each iteration of one worker: base time x every pattern's factor."""

    def __init__(self, base_seconds: float, patterns: list[Pattern] | None = None):
        if not base_seconds > 0:
            raise ValueError(f"device time must be > 0 s, got {base_seconds}")
        self.base = base_seconds
        self.patterns = list(patterns or [])
        self.iteration = 0
        self.last_factor = 1.0

    @classmethod
    def from_specs(cls, devices: str, patterns: list[str], rank: int, num_workers: int,
                   model: str | None = None, batch_size: int = 128, seed: int = 0
                   ) -> "DeviceClock":
        base = parse_devices(devices, num_workers, model, batch_size)[rank]
        return cls(base, [parse_pattern(p, rank, num_workers, seed, i)
                          for i, p in enumerate(patterns)])

    @classmethod
    def for_cluster(cls, devices: str, patterns: list[str], num_workers: int,
                    model: str | None = None, batch_size: int = 128, seed: int = 0
                    ) -> list["DeviceClock"]:
        """One clock per worker, as each worker of a job builds its own."""
        return [cls.from_specs(devices, patterns, r, num_workers, model, batch_size, seed)
                for r in range(num_workers)]

    def next_time(self, t: float) -> float:
        """Device seconds of the next iteration, which starts ``t`` seconds into training."""
        factor = 1.0
        for pattern in self.patterns:
            factor *= pattern.factor(self.iteration, t)
        self.iteration += 1
        self.last_factor = factor
        return self.base * factor

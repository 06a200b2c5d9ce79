"""Emulated stragglers: worker speeds and the time rule the emulation and the simulator share."""
from __future__ import annotations


def parse_speeds(text: str, num_workers: int | None = None) -> list[float]:
    """Worker speed factors from ``"1.0,0.43"``: each in (0, 1], one per worker (or one for all)."""
    speeds = []
    for part in str(text).split(","):
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"worker speed {part.strip()!r} is not a number (in {text!r})") from None
        if not 0 < value <= 1:
            raise ValueError(f"worker speed {value} must be in (0, 1] (1.0 = full speed; "
                             f"0.43 makes each iteration take 1/0.43 = 2.3 times as long)")
        speeds.append(value)
    if num_workers is not None and len(speeds) not in (1, num_workers):
        raise ValueError(f"{len(speeds)} worker speeds given ({text!r}) for {num_workers} workers; "
                         f"give one per worker or one for all")
    if num_workers is not None and len(speeds) == 1:
        speeds = speeds * num_workers
    return speeds


def stretched_time(compute: float, speed: float, jitter_draw: float = 0.0) -> float:
    """How long an iteration of ``compute`` seconds takes on a worker of ``speed``.

    ``compute / speed``, times ``1 + jitter_draw`` (a draw from ``[-jitter, jitter]``), but
    never less than ``compute``: an emulated straggler can only sleep, not run faster.
    The straggler emulation and the simulator both use this rule.
    """
    return max(compute, compute / speed * (1.0 + jitter_draw))

"""``python -m kvstore_ext.simulate``: iteration counts per paradigm (:func:`main`), or with
``--train CONFIG``, an experiment's model trained in virtual time (reproduce.py's flow with
every cluster virtual)."""
from __future__ import annotations

import argparse
import sys

from . import main as count_iterations


def train(argv) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvstore_ext.simulate --train",
        description="Train an experiment's model with every cluster's workers in virtual "
                    "time, in one process, through the same policies and the servers' "
                    "optimizer code; writes reproduce.py's table and plots, plus staleness "
                    "histograms and, over clusters of several sizes, time to target "
                    "against the number of workers.")
    parser.add_argument("--train", metavar="CONFIG", required=True,
                        help="an experiment YAML (reproduce.py's format); each cluster needs "
                             "device, and may set workers, latency, service (seconds per "
                             "message) and eval_every (virtual seconds between evaluations)")
    parser.add_argument("--out", default=None, help="results folder (default results/<name>)")
    parser.add_argument("--trials", type=int, default=None,
                        help="seeds per paradigm and cluster (default: the config's trials)")
    parser.add_argument("--quick", action="store_true",
                        help="apply the config's quick arguments (a shorter run)")
    parser.add_argument("--cluster", action="append", default=[],
                        help="only this cluster of the config (repeatable)")
    parser.add_argument("--paradigm", action="append", default=[],
                        help="only this paradigm, by its name in the config (repeatable)")
    parser.add_argument("--dry-run", action="store_true", help="print the runs, run nothing")
    args = parser.parse_args(argv)
    from ..reproduce import main as reproduce
    forwarded = [args.train, "--virtual"]
    for name in ("out", "trials"):
        if getattr(args, name) is not None:
            forwarded += [f"--{name}", str(getattr(args, name))]
    forwarded += ["--quick"] * args.quick + ["--dry-run"] * args.dry_run
    for name in ("cluster", "paradigm"):
        for value in getattr(args, name):
            forwarded += [f"--{name}", value]
    return reproduce(forwarded)


def run(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--train" or a.startswith("--train=") for a in argv):
        return train(argv)
    return count_iterations(argv)


if __name__ == "__main__":
    raise SystemExit(run())

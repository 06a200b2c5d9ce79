#!/usr/bin/env python3
"""The quick start: a mixed-speed 2-worker cluster trained with BSP, ASP, SSP and DSSP.

    make demo                          # or: python scripts/demo.py [--quick]

Runs configs/demo.yaml through reproduce.py: worker 1 is emulated at 0.43 of
worker 0's speed, every paradigm trains the paper's downsized AlexNet on the
MNIST digits shipped in data/ for the same time, and the table of time to two
test accuracies is printed; the plot of accuracy against time is saved beside
it (results/demo/ by default).
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import reproduce  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--quick", action="store_true",
                   help="6 seconds of training per paradigm instead of 30 (for CI)")
    p.add_argument("--out", default="results/demo", help="results folder (default results/demo)")
    args = p.parse_args(argv)
    config = os.path.join(HERE, "..", "configs", "demo.yaml")
    return reproduce.main([config, "--out", args.out] + (["--quick"] if args.quick else []))


if __name__ == "__main__":
    sys.exit(main())

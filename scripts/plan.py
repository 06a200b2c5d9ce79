#!/usr/bin/env python3
"""The planner: calibrate, predict, search, validate (``python -m kvstore_ext.plan --help``)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kvstore_ext.plan.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

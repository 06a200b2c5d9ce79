#!/usr/bin/env python3
"""Run a paper's experiment from its config (see ``kvstore_ext/reproduce.py`` and ``--help``).

    python scripts/reproduce.py configs/dssp_mnist.yaml            # make reproduce
    python scripts/reproduce.py configs/dssp_mnist.yaml --dry-run  # print the commands
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kvstore_ext.reproduce import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

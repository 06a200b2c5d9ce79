#!/usr/bin/env python3
"""Launch a distributed job; the same command line as MXNet's tools/launch.py. See --help."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__":
    from kvstore_ext_launch import main   # the launcher's role before the package's import
    sys.exit(main())

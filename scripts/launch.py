#!/usr/bin/env python3
"""Launch a distributed job; the same command line as MXNet's tools/launch.py. See --help."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__":
    # The launcher only starts processes: in its role (kvstore_ext.jobenv.LAUNCHER) the
    # package does not load mxnet, about 2 s of every job.  main() drops the role before it
    # starts any.
    os.environ["KVX_ROLE"] = "launcher"
    from kvstore_ext.launch import main
    sys.exit(main())

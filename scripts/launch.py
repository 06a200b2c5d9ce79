#!/usr/bin/env python3
"""Launch a distributed job; the same command line as MXNet's tools/launch.py. See --help."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# The launcher only starts processes: in its role the package does not load mxnet (about 2 s
# of every job).  The role is this process's alone: it is put back before any node starts.
_role = os.environ.get("KVX_ROLE")
os.environ["KVX_ROLE"] = "launcher"
try:
    from kvstore_ext.launch import main  # noqa: E402
finally:
    if _role is None:
        del os.environ["KVX_ROLE"]
    else:
        os.environ["KVX_ROLE"] = _role

if __name__ == "__main__":
    sys.exit(main())

"""The ``kvstore-launch`` command (and ``scripts/launch.py``): kvstore_ext's launcher, entered
from outside the package so that its role is set before the package is imported.

The launcher only starts processes; in its role (``kvstore_ext.jobenv.LAUNCHER``) importing
the package does not load mxnet, about 2 s of every job.  ``kvstore_ext.launch.main`` drops
the role before it starts any process.  The role is spelled here rather than read from
``kvstore_ext.jobenv``: importing that would import the package first."""
import os
import sys


def main(argv=None) -> int:
    os.environ["KVX_ROLE"] = "launcher"
    from kvstore_ext.launch import main as launch
    return launch(argv)


if __name__ == "__main__":
    sys.exit(main())

"""``python -m kvstore_ext.simulate``: iteration counts per paradigm (:func:`main`), or with
``--train CONFIG``, an experiment's model trained in virtual time: reproduce.py's run with
every cluster virtual (``reproduce.py CONFIG --virtual``; its options apply, ``--jobs N``
among them: N runs side by side, each in a process of one thread)."""
from __future__ import annotations

import sys

from . import main as count_iterations


def run(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(argv):
        if arg == "--train" and i + 1 < len(argv):
            config = argv[i + 1]
            rest = argv[:i] + argv[i + 2:]
        elif arg.startswith("--train="):
            config = arg.split("=", 1)[1]
            rest = argv[:i] + argv[i + 1:]
        else:
            continue
        from ..reproduce import main as reproduce
        return reproduce([config, "--virtual", *rest])
    return count_iterations(argv)


if __name__ == "__main__":
    raise SystemExit(run())

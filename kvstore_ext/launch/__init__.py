"""Starting jobs: the command line (:mod:`.cli`), the processes and their supervision
(:mod:`.process`), parameter-server jobs (:mod:`.ps_job`) and Horovod jobs (:mod:`.horovod_job`).

    python -m kvstore_ext.launch -n 2 -s 1 python train.py --kvstore dist_ssp
"""
from .cli import build_parser, main, run_local_job

__all__ = ["build_parser", "main", "run_local_job"]

"""The end of a training script's run: the store's metrics, the JSON result, the weights."""
from __future__ import annotations

import json
import os


def finish_run(result: dict, kv=None, out: str | None = None, save_params: str | None = None,
               net=None) -> dict:
    """Add the store's statistics, save its metrics, write ``result`` and the weights.

    ``out`` and ``save_params`` may hold ``{rank}``, replaced by ``result['rank']``.
    """
    rank = str(result["rank"])
    if kv is not None and hasattr(kv, "stats"):
        result["kvstore_stats"] = kv.stats()
        kv.save_metrics()
    if out:
        path = out.replace("{rank}", rank)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    if save_params and net is not None:
        net.save_parameters(save_params.replace("{rank}", rank))
    return result

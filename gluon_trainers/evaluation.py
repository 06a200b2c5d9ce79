"""What training scripts share at the end of a run: test accuracy, the store's metrics, the JSON result."""
from __future__ import annotations

import json
import os


def finish_run(result: dict, kv=None, out: str | None = None, save_params: str | None = None,
               net=None) -> dict:
    """Save the weights, add the store's statistics, write ``result``, save the store's metrics
    (in that order: a failure at the end loses nothing written before it).

    ``out`` and ``save_params`` may hold ``{rank}``, replaced by ``result['rank']``.
    """
    rank = str(result["rank"])
    if save_params and net is not None:     # first: nothing after it can lose the model
        path = save_params.replace("{rank}", rank)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)   # as for ``out``
        net.save_parameters(path)
    if kv is not None and hasattr(kv, "stats"):
        result["kvstore_stats"] = kv.stats()
    if out:
        path = out.replace("{rank}", rank)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    if kv is not None and hasattr(kv, "save_metrics"):
        kv.save_metrics()
    return result


def evaluate(net, x, y, batch_size: int = 500) -> float:
    """Top-1 accuracy of ``net`` on numpy images ``x`` and labels ``y``."""
    import mxnet as mx
    correct = 0
    for i in range(0, len(x), batch_size):
        out = net(mx.nd.array(x[i:i + batch_size]))
        correct += int((out.argmax(axis=1).asnumpy() == y[i:i + batch_size]).sum())
    return correct / len(x)

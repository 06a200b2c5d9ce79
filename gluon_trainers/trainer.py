"""A Gluon Trainer that sends all keys of a step in one kvstore call."""
from __future__ import annotations

from mxnet import gluon


class Trainer(gluon.Trainer):
    """``gluon.Trainer`` with the same constructor and ``step``, batched on the wire.

    Stock ``gluon.Trainer`` calls ``kvstore.pushpull`` once per parameter, which costs one
    round trip per key.  This one makes a single list call per step, which a kvstore_ext
    store (and MXNet's own stores) turn into one message per server.
    """

    def _allreduce_grads(self):
        if not self._kvstore:
            return
        keys, grads, outs = [], [], []
        for i, param in enumerate(self._params):
            if param.grad_req == "null":
                continue
            grad_list = param.list_grad()
            if grad_list[0].stype != "default":
                # sparse gradients keep the stock per-key push and pull
                return super()._allreduce_grads()
            keys.append(i)
            grads.append(grad_list)
            outs.append(param.list_data() if self._update_on_kvstore else grad_list)
        if keys:
            self._kvstore.pushpull(keys, grads, out=outs)


def make_kvstore(name: str, **params):
    """``(kv, rank, num_workers)`` for a script's ``--kvstore``.

    A name without "dist" ('local', 'device', 'none') gives no store: one process, and Gluon
    creates what its devices need.  Store parameters (``lambda0=0.1``) go through
    ``kvstore_ext.create``; anything else through ``mx.kv.create``, MXNet's own stores included.
    """
    if "dist" not in name:
        return None, 0, 1
    if params:
        import kvstore_ext
        kv = kvstore_ext.create(name, **params)
    else:
        import mxnet as mx
        kv = mx.kv.create(name)
    return kv, kv.rank, kv.num_workers


def start_together(kv) -> None:
    """Wait until every worker of the job is here, so that clocks started next agree.

    A worker that imports faster would otherwise start its ``--max-time`` clock seconds before
    the others; under a synchronous store it then stops early and leaves the last one training
    alone.  Our stores and Horovod's expose ``barrier()``, MXNet's own ``_barrier()``; a local
    store has nothing to wait for.
    """
    if kv is None or getattr(kv, "num_workers", 1) <= 1:
        return
    if hasattr(kv, "barrier"):
        kv.barrier()
    elif hasattr(kv, "_barrier"):
        kv._barrier()

"""A plain MXNet Module MNIST script, as a user of the symbolic API writes it: only the
kvstore name changes.

LeNet as a symbol (conv 20x5x5 tanh, max-pool 2, conv 50x5x5 tanh, max-pool 2, dense 500
tanh, dense 10, SoftmaxOutput), ``mx.mod.Module.fit`` with momentum SGD given by name, each
worker on its share of 8,000 training digits, tested on 2,000 held-out ones.  Run it under
launch.py with any store, MXNet's own included:

    python scripts/launch.py -n 2 -s 1 python scripts/plain_module_mnist.py --kvstore dist_bsp
    python scripts/launch.py -n 2 -s 1 --backend mxnet \\
        python scripts/plain_module_mnist.py --kvstore dist_sync

Module normalises the gradient itself: ``rescale_grad`` is 1 / (batch x workers) on a store
that sums every worker's gradient before one update (``dist_sync``, ``dist_bsp``), 1 / batch
on one that applies each push (``dist_async``, ``dist_asp``, ...).  Prints one
``RESULT {json}`` line per worker, with the final weights' checksum (``--weights-out`` saves
them).
"""
import argparse
import json
import os
import sys

import mxnet as mx
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvstore_ext  # noqa: E402,F401  (registers dist_bsp, ...; harmless for MXNet's own stores)
from gluon_trainers.data import load_mnist, shard  # noqa: E402


def lenet_symbol():
    data = mx.sym.Variable("data")
    net = mx.sym.Convolution(data, kernel=(5, 5), num_filter=20, name="conv1")
    net = mx.sym.Pooling(mx.sym.Activation(net, act_type="tanh"), pool_type="max",
                         kernel=(2, 2), stride=(2, 2))
    net = mx.sym.Convolution(net, kernel=(5, 5), num_filter=50, name="conv2")
    net = mx.sym.Pooling(mx.sym.Activation(net, act_type="tanh"), pool_type="max",
                         kernel=(2, 2), stride=(2, 2))
    net = mx.sym.FullyConnected(mx.sym.flatten(net), num_hidden=500, name="fc1")
    net = mx.sym.FullyConnected(mx.sym.Activation(net, act_type="tanh"), num_hidden=10,
                                name="fc2")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvstore", required=True,
                   help="any store: dist_bsp, dist_asp, ... or MXNet's dist_sync (--backend mxnet)")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate (default 0.1)")
    p.add_argument("--momentum", type=float, default=0.9, help="momentum (default 0.9)")
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch (default 32)")
    p.add_argument("--epochs", type=int, default=1, help="passes over each share (default 1)")
    p.add_argument("--seed", type=int, default=1, help="seed of the weights (default 1)")
    p.add_argument("--data", default=None, help="MNIST .npz (default: $KVX_MNIST or data/)")
    p.add_argument("--weights-out", default=None,
                   help="worker 0 saves the final weights here (.npz, one array per name)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    kv = mx.kv.create(args.kvstore)
    x_train, y_train, x_test, y_test = load_mnist(args.data, 8000, 2000)
    train = mx.io.NDArrayIter(*shard(x_train, y_train, kv.rank, kv.num_workers), args.batch_size,
                              last_batch_handle="discard", label_name="softmax_label")
    test = mx.io.NDArrayIter(x_test, y_test, 500, label_name="softmax_label")
    mod = mx.mod.Module(lenet_symbol(), context=mx.cpu())
    mod.fit(train, num_epoch=args.epochs, kvstore=kv, optimizer="sgd",
            optimizer_params={"learning_rate": args.lr, "momentum": args.momentum},
            initializer=mx.init.Xavier(), eval_metric="acc")
    accuracy = dict(mod.score(test, "acc"))["accuracy"]
    arg_params, _ = mod.get_params()
    weights = {k: v.asnumpy() for k, v in sorted(arg_params.items())}
    if args.weights_out and kv.rank == 0:
        np.savez(args.weights_out, **weights)
    result = {"rank": kv.rank, "num_workers": kv.num_workers, "kvstore": args.kvstore,
              "accuracy": accuracy, "rescale_grad": mod._optimizer.rescale_grad,
              "weights_sum": float(sum(np.abs(w).sum(dtype=np.float64)
                                       for w in weights.values()))}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

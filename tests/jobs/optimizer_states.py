"""Save the servers' optimizer states, check the file is MXNet's format, load it back.
Worker 1 then loads a file of its own (momentum all zeros): worker 0's load is the one the
servers keep, as worker 0's values are for init."""
import json
import sys

import mxnet as mx
import numpy as np

import kvstore_ext  # noqa: F401

out = sys.argv[1]
kv = mx.kv.create("dist_bsp")
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, rescale_grad=0.5))
shapes = {"small": (4, 5), "big": (30, 10)}    # 'big' is split over both servers
keys = list(shapes)
weights = [mx.nd.zeros(s) for s in shapes.values()]
kv.init(keys, weights)
for i in range(3):
    kv.pushpull(keys, [mx.nd.ones(s) * (i + 1) for s in shapes.values()], out=weights)
report = {}
if kv.rank == 0:
    kv.save_optimizer_states(out, dump_optimizer=True)
    updater = mx.optimizer.get_updater(mx.optimizer.SGD())
    updater.set_states(open(out, "rb").read())        # MXNet's own Updater reads the file
    report["optimizer"] = type(updater.optimizer).__name__
    report["momentum"] = updater.optimizer.momentum
    report["shapes"] = {str(k): list(updater.states[k].shape) for k in keys}
    # momentum after 3 steps of gradients 1, 2, 3 (summed over 2 workers, rescaled by 0.5)
    report["mom0"] = float(updater.states["small"].asnumpy().ravel()[0])
    kv.load_optimizer_states(out)
kv.barrier()
if kv.rank == 1:
    own = mx.optimizer.get_updater(mx.optimizer.SGD(momentum=0.9))
    own.states = {k: mx.nd.zeros(s) for k, s in shapes.items()}
    with open(out + ".worker1", "wb") as f:
        f.write(own.get_states(dump_optimizer=True))
    kv.load_optimizer_states(out + ".worker1")
kv.barrier()
if kv.rank == 0:
    kv.save_optimizer_states(out + ".again", dump_optimizer=False)
    again = mx.optimizer.get_updater(mx.optimizer.SGD())
    again.set_states(open(out + ".again", "rb").read())
    report["round_trip_equal"] = all(
        np.array_equal(again.states[k].asnumpy(), updater.states[k].asnumpy()) for k in keys)
    with open(out + ".json", "w") as f:
        json.dump(report, f)
kv.barrier()

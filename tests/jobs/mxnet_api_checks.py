"""The KVStore API as MXNet's own distributed tests use it, for one store: values and errors.

    launch.py -n N -s S python mxnet_api_checks.py STORE OUT

Run on MXNet's ``dist_sync`` (``--backend mxnet``) and on a kvstore_ext store; the test
compares the two reports.  Each check records the values it read (or the error it got as
``"<ExceptionType>: message"``), so that a difference names the call.  Worker ``r`` writes
``OUT.r.json``.
"""
import json
import sys

import mxnet as mx
import numpy as np

import kvstore_ext  # noqa: F401

store, out = sys.argv[1], sys.argv[2]
native = store in ("dist_sync", "dist_async")      # MXNet's own
kv = mx.kv.create(store)
rank, n = kv.rank, kv.num_workers
RATE = 2            # the 'test' optimizer's rescale_grad: weight += RATE * summed gradient
SMALL, BIG = (2, 3), (1200, 1200)      # BIG is over MXNET_KVSTORE_BIGARRAY_BOUND: split
report = {"store": store, "num_workers": n}


def outcome(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the report names it
        return f"{type(e).__name__}: {e}".splitlines()[0][:400]


def summary(a):
    """Min and max of an array (every element of these checks is the same number)."""
    x = a.asnumpy().astype(np.float64)
    return [float(x.min()), float(x.max())]


def pulled_array(key, shape, dtype="float32"):
    val = mx.nd.zeros(shape, dtype=dtype)
    kv.pull(key, out=val)
    return val.asnumpy()


def pulled(key, shape, dtype="float32"):
    """The key's value, pulled into a new array, as :func:`summary`."""
    val = mx.nd.zeros(shape, dtype=dtype)
    kv.pull(key, out=val)
    return summary(val)


# -- keys made with init and read back (MXNet's test_sync_init, CPU part) ------------------------
# (int keys throughout: gluon.Trainer below uses int keys on the same store, and a store's keys
# are all ints or all strs)
def init_reads():
    got = []
    for i, (key, shape, dtype) in enumerate([(200, SMALL, "float32"), (201, SMALL, "float16"),
                                             (300, BIG, "float32"), (301, BIG, "float16")]):
        kv.init(key, mx.nd.ones(shape, dtype=dtype) * (i + 1))
        got.append([key, dtype, pulled(key, shape, dtype)])
    return got


report["init"] = outcome(init_reads)

# -- push then pull, in a loop, under MXNet's 'test' optimizer with multi-precision (MXNet's
#    test_sync_push_pull, dense keys; its float16 keys keep float32 copies on the servers) -------
keys = [(3, SMALL, "float32"), (99, BIG, "float32"), (4, SMALL, "float16"),
        (100, BIG, "float16")]
kv.init([k for k, _, _ in keys], [mx.nd.ones(s, dtype=d) for _, s, d in keys])
kv.set_optimizer(mx.optimizer.create("test", rescale_grad=RATE, multi_precision=True))


def push_pull_loop():
    got = []
    for k, s, d in keys:
        for i in range(3):
            kv.push(k, mx.nd.ones(s, dtype=d) * (rank + 1))
            got.append([k, i, pulled(k, s, d)])
    return got


report["push_pull"] = outcome(push_pull_loop)


def list_calls():
    """One call for several keys: push a list, pull a list, pushpull a list into new arrays."""
    ks = [3, 99]
    kv.push(ks, [mx.nd.ones(SMALL), mx.nd.ones(BIG)])
    outs = [mx.nd.zeros(SMALL), mx.nd.zeros(BIG)]
    kv.pull(ks, out=outs)
    got = [summary(o) for o in outs]
    outs2 = [mx.nd.zeros(SMALL), mx.nd.zeros(BIG)]
    kv.pushpull(ks, [mx.nd.ones(SMALL) * 2, mx.nd.ones(BIG) * 2], out=outs2)
    return got + [summary(o) for o in outs2]


report["list_calls"] = outcome(list_calls)


def device_lists():
    """A value given as one array per device is summed on the worker first."""
    kv.push(3, [mx.nd.ones(SMALL, ctx=mx.cpu(i)) for i in range(2)])
    outs = [mx.nd.zeros(SMALL, ctx=mx.cpu(i)) for i in range(2)]
    kv.pull(3, out=outs)
    return [summary(o) for o in outs]


report["device_lists"] = outcome(device_lists)


def broadcast():
    out = mx.nd.zeros(SMALL)
    kv.broadcast(500, mx.nd.ones(SMALL) * (rank + 7), out=out)
    return summary(out)


report["broadcast"] = outcome(broadcast)


def call_forms():
    """The forms MXNet's custom-store tests use: one key into several outs, a list of keys into
    nested outs, pushpull in place (no out), and a list of keys with one value per device."""
    devs = [mx.cpu(i) for i in range(4)]
    outs = [mx.nd.empty(SMALL) for _ in range(3)]
    kv.broadcast(600, mx.nd.ones(SMALL) * 5, out=outs)
    got = [[summary(o) for o in outs]]
    nested = [[mx.nd.empty(SMALL) for _ in range(2)] for _ in range(2)]
    kv.broadcast([601, 602], [mx.nd.ones(SMALL) * 6, mx.nd.ones(SMALL) * 7], out=nested)
    got.append([[summary(o) for o in row] for row in nested])
    vals = [mx.nd.ones(SMALL, d) for d in devs]
    kv.pushpull(600, vals)
    got.append([summary(v) for v in vals])
    vals = [[mx.nd.ones(SMALL, d) * 2 for d in devs] for _ in range(2)]
    outs = [[mx.nd.empty(SMALL, d) for d in devs] for _ in range(2)]
    kv.pushpull([601, 602], vals, out=outs)
    got.append([[summary(o) for o in row] for row in outs])
    return got


report["call_forms"] = outcome(call_forms)


def repeated_per_key():
    """Per-key pushpull made again and again with the same arrays, as gluon.Trainer makes it
    (kvstore_ext then skips the call's checks), and then with a new out array, a new gradient
    array, each as a list of one, and in place: every call must read its gradient as it is
    now and write the out array it names, and no other.  Each step sets the gradients first,
    as a backward pass would (MXNet's pushpull leaves the pulled weights in a single CPU
    gradient array)."""
    ks = (700, 701)                    # a small key, and one split over the servers
    kv.init(list(ks), [mx.nd.zeros(SMALL), mx.nd.zeros(BIG)])
    grads = {700: mx.nd.ones(SMALL), 701: mx.nd.ones(BIG)}
    outs = {700: mx.nd.zeros(SMALL), 701: mx.nd.zeros(BIG)}
    got = []

    def step(value, form=lambda a: a):
        for k in ks:
            grads[k][:] = value + k - 700
            kv.pushpull(k, form(grads[k]), out=form(outs[k]))
        got.append([summary(outs[k]) for k in ks])

    for i in range(4):
        step(i + 1)
    old, outs[700] = outs[700], mx.nd.zeros(SMALL)
    step(5)
    got.append(summary(old))           # left as the call before wrote it
    step(6)
    grads[700] = mx.nd.ones(SMALL)
    step(7)
    step(8)
    step(9, lambda a: [a])
    step(10)
    grads[700][:] = 11
    kv.pushpull(700, grads[700])       # in place
    got.append(summary(grads[700]))
    step(12)
    step(13)
    return got


report["repeated_per_key"] = outcome(repeated_per_key)


def repeated_keys():
    """A key named twice in one list call: MXNet merges it (GroupKVPairs), so its pushes are
    summed and every out is filled; a key split over the servers too."""
    kv.init([710, 711], [mx.nd.zeros(SMALL), mx.nd.zeros(BIG)])
    kv.push([710, 710, 711, 711], [mx.nd.ones(SMALL), mx.nd.ones(SMALL) * 2,
                                   mx.nd.ones(BIG), mx.nd.ones(BIG) * 3])
    outs = [mx.nd.zeros(SMALL), mx.nd.zeros(SMALL), mx.nd.zeros(BIG)]
    kv.pull([710, 710, 711], out=outs)
    got = [summary(o) for o in outs]
    outs = [mx.nd.zeros(SMALL), mx.nd.zeros(BIG), mx.nd.zeros(SMALL)]
    kv.pushpull([710, 711, 710], [mx.nd.ones(SMALL), mx.nd.ones(BIG), mx.nd.ones(SMALL) * 4],
                out=outs)
    return got + [summary(o) for o in outs]


report["repeated_keys"] = outcome(repeated_keys)



# -- bad calls: MXNet's dist_sync server aborts on a pull of a key never initialised ("init 777
#    first"), which stops the job; kvstore_ext's stores raise an error on the worker ----------------
if not native:
    report["pull_unknown_key"] = outcome(lambda: kv.pull(777, out=mx.nd.zeros(SMALL)) or
                                         mx.nd.waitall())
    report["push_wrong_shape"] = outcome(lambda: kv.push(3, mx.nd.ones((3, 3))) or
                                         mx.nd.waitall())
    report["init_repeated_key"] = outcome(lambda: kv.init([720, 720], [mx.nd.zeros(SMALL)] * 2))


# -- gluon.Trainer on the store (MXNet's gluon_step_cpu and gluon_type_cpu) ------------------------
def trainer_step():
    x = mx.gluon.Parameter("x", shape=(10, 1))
    x.initialize(ctx=mx.cpu(0), init="ones")
    trainer = mx.gluon.Trainer([x], "sgd", {"learning_rate": 1.0, "multi_precision": False},
                               kvstore=kv)
    with mx.autograd.record():
        y = (rank + 1) * x.data(mx.cpu(0))
        y.backward()
    trainer.step(1)
    return summary(x.data(mx.cpu(0)))


report["trainer_step"] = outcome(trainer_step)


def trainer_update_on_kvstore(choice):
    def check():
        params = mx.gluon.ParameterDict()
        params.get("x", shape=(10, 1))
        params.initialize(ctx=[mx.cpu(0), mx.cpu(1)], init="zeros")
        trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1}, kvstore=kv,
                                   update_on_kvstore=choice)
        trainer._init_kvstore()
        return [trainer._kv_initialized, trainer._update_on_kvstore]
    return outcome(check)


for choice in (None, True, False):
    report[f"trainer_update_on_kvstore={choice}"] = trainer_update_on_kvstore(choice)


# -- what kvstore_ext refuses by design; after each refusal the store goes on working -------------
def sparse_init():
    kv.init(901, mx.nd.ones((2, 2)).tostype("row_sparse"))


def sparse_trainer():
    params = mx.gluon.ParameterDict()
    x = params.get("emb", shape=(10, 1), stype="row_sparse", grad_stype="row_sparse")
    params.initialize(ctx=mx.cpu(0), init="zeros")
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1}, kvstore=kv)
    x.row_sparse_data(mx.nd.arange(0, 10))
    trainer._init_kvstore()


def sparse_gradient_trainer():
    params = mx.gluon.ParameterDict()
    params.get("w", shape=(10, 1), grad_stype="row_sparse")
    params.initialize(ctx=mx.cpu(0), init="zeros")
    mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1}, kvstore=kv)._init_kvstore()


def compression_trainer():
    params = mx.gluon.ParameterDict()
    params.get("c", shape=(10, 1))
    params.initialize(ctx=mx.cpu(0), init="zeros")
    mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1}, kvstore=kv,
                     compression_params={"type": "2bit", "threshold": 0.5})._init_kvstore()


if not native:   # MXNet's supports these; kvstore_ext's refuse them at the call
    report["refused"] = {
        "init_row_sparse": outcome(sparse_init),
        "push_row_sparse": outcome(lambda: kv.push(3, mx.nd.ones(SMALL).tostype("row_sparse"))),
        "pull_into_row_sparse": outcome(
            lambda: kv.pull(3, out=mx.nd.zeros(SMALL).tostype("row_sparse"))),
        "row_sparse_pull": outcome(lambda: kv.row_sparse_pull(
            3, out=mx.nd.zeros(SMALL).tostype("row_sparse"), row_ids=mx.nd.array([0, 1]))),
        "set_gradient_compression": outcome(
            lambda: kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})),
        "trainer_row_sparse_weight": outcome(sparse_trainer),
        "trainer_row_sparse_gradient": outcome(sparse_gradient_trainer),
        "trainer_compression": outcome(compression_trainer),
    }


def after():
    kv.push(3, mx.nd.ones(SMALL))
    return pulled(3, SMALL)


report["after_refusals"] = outcome(after)


def device_sum_order():
    """A key pushed from 3 and from 6 devices: MXNet adds the first device's value to the sum
    of the next up to four, left to right; the bits show the order (1 + 2**-24 + 2**-24 is 1
    one way round and 1.0000001 the other)."""
    import hashlib
    kv.set_optimizer(mx.optimizer.create("test", rescale_grad=1.0))
    got = []
    for k, devices in ((750, 3), (751, 6)):
        kv.init(k, mx.nd.zeros((1000,)))
        rng = np.random.RandomState(k)
        values = [np.full(1000, 1.0, np.float32)] + \
            [rng.uniform(-2e-7, 2e-7, 1000).astype(np.float32) for _ in range(devices - 1)]
        kv.push(k, [mx.nd.array(v, ctx=mx.cpu(i)) for i, v in enumerate(values)])
        got.append(hashlib.sha256(pulled_array(k, (1000,)).tobytes()).hexdigest())
    return got


report["device_sum_order"] = outcome(device_sum_order)


def optimizer_set_again():
    """kv.set_optimizer with an optimizer equal to the one in use starts it anew: MXNet's
    servers install a fresh updater on every call, so Adam's moments and count restart."""
    kv.init(730, mx.nd.ones(SMALL))
    got = []
    for step in range(5):
        if step in (0, 3):
            kv.set_optimizer(mx.optimizer.create("adam", learning_rate=0.1))
        kv.push(730, mx.nd.ones(SMALL) * (step + 1))
        got.append(pulled(730, SMALL))
    return got


report["optimizer_set_again"] = outcome(optimizer_set_again)


def norm_per_block():
    """LAMB takes a norm over each server's block of a split key: the same weights as MXNet's
    only if the key is cut where MXNet cuts it (1,000,001 elements over 2 servers)."""
    import hashlib
    size = 1_000_001
    kv.init(740, mx.nd.array(np.linspace(-1, 1, size, dtype=np.float32)))
    kv.set_optimizer(mx.optimizer.create("lamb", learning_rate=0.01))
    got = []
    for step in range(2):
        kv.push(740, mx.nd.array(np.cos(np.arange(size, dtype=np.float32) * (step + 1))))
        val = mx.nd.zeros((size,))
        kv.pull(740, out=val)
        got.append(hashlib.sha256(val.asnumpy().tobytes()).hexdigest())
    return got


report["norm_per_block"] = outcome(norm_per_block)
kv._barrier()
with open(f"{out}.{rank}.json", "w") as f:
    json.dump(report, f)
print(f"worker {rank} done", flush=True)

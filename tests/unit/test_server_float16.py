"""A server holds float16 keys in float32, as MXNet's servers do: a round's float16 gradients
are summed and updated in float32 and the weights go back rounded to float16
(``tests/integration/test_mxnet_api.py`` compares the bits with MXNet's own stores)."""
import mxnet as mx
import numpy as np
import pytest

from server_harness import buffers_of, install, items_of, make_server


@pytest.mark.parametrize("store", ["dist_bsp", "dist_asp"])
def test_float16_gradients_are_summed_and_applied_in_float32(monkeypatch, store):
    install(monkeypatch)
    workers = 2 if store == "dist_bsp" else 1
    s = make_server(store, {}, workers, True, [3, 4], [np.float16, np.float32],
                    optimizer=lambda: mx.optimizer.SGD(learning_rate=0.1))
    half, single = s.slots[(0, 0)], s.slots[(1, 0)]
    assert (half.dtype, half.home.dtype) == (np.float16, np.float32)
    assert half.home is not single.home and single.home.dtype == np.float32
    start = half.weight.asnumpy().copy()
    grads = [np.full(3, 40000, np.float16), np.full(4, 1e-4, np.float32)]
    for seq in (1, 2):   # on dist_bsp one round of both workers; on dist_asp two updates
        header = {"op": "pushpull", "seq": seq, "worker": seq - 1 if workers == 2 else 0,
                  "items": items_of(s, [0, 1])}
        s.op_push(b"x", header, buffers_of(grads))
        s.send_value_replies()
    # 0.1 * 40,000 twice, in float32: summed first on dist_bsp (in float16 it was inf)
    weights = start - np.float32(8000) if workers == 2 else start - np.float32(4000) - \
        np.float32(4000)
    assert np.array_equal(half.weight.asnumpy(), weights)
    expected = weights.astype(np.float16)
    reply = s.sent[2][3]
    assert np.frombuffer(b"".join(map(bytes, reply)), np.float16, count=3).tobytes() == \
        expected.tobytes()


def test_the_virtual_time_server_holds_float16_keys_as_the_real_one_does(monkeypatch):
    """The same rounds of float16 gradients (2 workers, SGD with momentum) through a real
    server's code and through a virtual-time server: the same float16 bits pulled after
    every round (both hold the key in float32: ``optimizers.home_dtype``)."""
    from kvstore_ext.optimizers import ServerOptimizer
    from kvstore_ext.ps.partition import Partitioner
    from kvstore_ext.virtual_training import ServerState

    def sgd():
        return mx.optimizer.SGD(learning_rate=0.05, momentum=0.9, wd=1e-4, rescale_grad=0.5)
    install(monkeypatch)
    size = 301
    real = make_server("dist_bsp", {}, 2, True, [size], [np.float16], optimizer=sgd)
    start = real.slots[(0, 0)].weight.asnumpy().astype(np.float16)
    virtual = ServerState(0, list(Partitioner(1, 1_000_000).blocks(0, size)), {0: start},
                          ServerOptimizer(sgd(), "dist_bsp", False))
    acc = virtual.homes[np.dtype(np.float16)].view("grad", 0, size)
    rng = np.random.default_rng(7)
    seq = 0
    for _ in range(4):
        grads = [rng.uniform(-0.05, 0.05, size).astype(np.float16) for _ in range(2)]
        for worker, grad in enumerate(grads):
            seq += 1
            real.op_push(b"x", {"op": "pushpull", "seq": seq, "worker": worker,
                                "items": items_of(real, [0])}, buffers_of([grad]))
        real.send_value_replies()
        for grad in grads:                 # one push, one gather
            virtual.gather([(mx.nd.array(grad, dtype="float16"), acc)])
        virtual.apply()
        pulled = np.frombuffer(b"".join(map(bytes, real.sent[seq][3])), np.float16, count=size)
        assert pulled.tobytes() == virtual.snapshot()[np.dtype(np.float16)].asnumpy().tobytes()
    assert not np.array_equal(pulled, start)

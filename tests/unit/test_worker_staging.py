"""The worker's round against MXNet itself, without a job: gradients staged in one buffer,
checks remembered until an array changes, weights written back by asynchronous engine
operations that end together."""
import functools
import threading
import time

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

from kvstore_ext import engine
from kvstore_ext.errors import KVStoreError
from kvstore_ext.ps.batching import WriteBack
from kvstore_ext.ps.link import Ticket, when_answered
from kvstore_ext.ps.partition import Partitioner
from kvstore_ext.ps.store import ParameterServerStore, RepeatedCall
from kvstore_ext.ps.transport import DEFAULT_MAX_FRAME_BYTES, Codec

F32 = np.dtype("float32")


@pytest.fixture
def kv(monkeypatch):
    """A store with two servers and no job: keys of 5 elements or more are split."""
    def no_job(self):
        self._type = "dist_bsp"
        self._frame_limit = DEFAULT_MAX_FRAME_BYTES
        self._part = Partitioner(2, bigarray_bound=5)
        self._meta = {0: ((2, 3), F32), 1: ((4,), F32), 2: ((2, 2), np.dtype("float64"))}

    monkeypatch.setattr(ParameterServerStore, "__init__", no_job)
    return ParameterServerStore()


def owner(buf):
    while buf.base is not None and isinstance(buf.base, np.ndarray):
        buf = buf.base
    return buf


def staged(plan):
    """Per (key, block): the staging buffer's segment a message carries (a fresh call's plan)."""
    return {(b.key, b.index): buf for _, bufs, where in plan.values() for b, buf in zip(where, bufs)}


def pushed(plan):
    """Per (key, block): the values its server receives (each message sealed, then opened)."""
    codec, out = Codec(b"0" * 32, names={"server:0", "server:1"}), {}
    for server, (items, bufs, where) in plan.items():
        frames = codec.seal({"op": "pushpull", "items": items}, bufs, to=f"server:{server}")
        _, received = codec.open([bytes(f) for f in frames])
        assert len(received) == len(where) == len(items), server
        for b, item, buf in zip(where, items, received):
            out[b.key, b.index] = np.frombuffer(buf, np.dtype(item[2]))
    return out


def test_a_calls_gradients_are_staged_side_by_side_in_each_servers_buffer(kv):
    """Keys 1 and 3 (server 1) lie side by side in server 1's buffer though key 2 (server 0)
    comes between them, and a later call's keys follow them there: one frame a message.
    Key 0, cut across both servers, is staged whole in its first block's server's buffer."""
    kv._meta[3] = ((4,), F32)
    g0 = mx.nd.arange(6).reshape((2, 3))
    g1, g3 = mx.nd.array([7, 8, 9, 10]), mx.nd.array([1, 2, 3, 4])
    g2 = mx.nd.ones((2, 2), dtype="float64")
    plan = kv._plan("pushpull", [(0, g0), (1, g1), (2, g2), (3, g3)])
    bufs = staged(plan)
    assert sorted(bufs) == [(0, 0), (0, 1), (1, 0), (2, 0), (3, 0)]   # key 0 cut in two
    assert np.array_equal(np.concatenate([bufs[0, 0], bufs[0, 1]]), np.arange(6))
    assert np.array_equal(bufs[1, 0], [7, 8, 9, 10]) and np.array_equal(bufs[3, 0], [1, 2, 3, 4])
    items = {s: its for s, (its, _, _) in plan.items()}
    assert items == {0: [[0, 0, "<f4", 3], [2, 0, "<f8", 4]],
                     1: [[0, 1, "<f4", 3], [1, 0, "<f4", 4], [3, 0, "<f4", 4]]}
    address = lambda a: a.__array_interface__["data"][0]
    assert owner(bufs[0, 0]) is owner(bufs[0, 1]) is owner(bufs[2, 0])
    assert owner(bufs[1, 0]) is owner(bufs[3, 0]) is not owner(bufs[0, 0])
    assert address(bufs[0, 1]) == address(bufs[0, 0]) + 12          # key 0 whole
    assert address(bufs[2, 0]) == address(bufs[0, 0]) + 24          # 24 bytes, 8-aligned
    assert address(bufs[3, 0]) == address(bufs[1, 0]) + 16
    later = staged(kv._plan("pushpull", [(1, g1)]))[1, 0]
    assert owner(later) is owner(bufs[1, 0]) and address(later) == address(bufs[3, 0]) + 16


def test_keys_that_alternate_between_servers_travel_as_one_frame_to_each():
    """ResNet-20's shapes on two servers: its keys alternate between them, and each server's
    push from a worker is one frame besides the header's, as the planner counts it."""
    from kvstore_ext.plan.jobs import model_shapes
    from kvstore_ext.plan.model import staged_frames
    from kvstore_ext.ps.transport import Codec

    def no_job(self):
        self._type = "dist_bsp"
        self._frame_limit = DEFAULT_MAX_FRAME_BYTES
        self._part = Partitioner(2)
        self._meta = {k: (tuple(s), F32) for k, s in enumerate(model_shapes("cifar_resnet20_v1"))}
    kv = ParameterServerStore.__new__(ParameterServerStore)
    no_job(kv)
    grads = [mx.nd.ones(shape) * k for k, (shape, _) in kv._meta.items()]
    plan = kv._plan("pushpull", list(enumerate(grads)))
    codec = Codec(b"0" * 32)
    model = staged_frames([plan[s][2] for s in (0, 1)])
    for server, (_, bufs, where) in plan.items():
        frames = codec.seal({"op": "pushpull"}, bufs, to="server:%d" % server)
        assert len(frames) - 3 == 1 == model[server], server
        for b, buf in zip(where, bufs):
            assert np.all(buf == b.key)


def test_values_of_several_devices_are_summed_in_mxnets_order(kv):
    """MXNet's CPU reduce (comm.h, ReduceSumCPU): the first value plus the sum of the next up
    to four, left to right, and so on; 0.1 + (0.2 + 0.3) is 0.6, (0.1 + 0.2) + 0.3 is not."""
    values = [0.1, 0.2, 0.3, 0.7, 1e-17, 0.9]
    parts = [mx.nd.full((2, 2), v, dtype="float64") for v in values]
    (buf,) = pushed(kv._plan("push", [(2, parts)])).values()
    a = [np.full(4, v) for v in values]
    want = (a[0] + (((a[1] + a[2]) + a[3]) + a[4])) + a[5]
    assert np.array_equal(buf, want)
    (buf,) = pushed(kv._plan("push", [(2, parts[:3])])).values()
    assert np.array_equal(buf, np.full(4, 0.6)) and (0.1 + 0.2) + 0.3 != 0.6


def test_a_pull_stages_nothing(kv):
    plan = kv._plan("pull", [(1, None)])
    assert plan == {1: ([[1, 0, "<f4", 4]], [], plan[1][2])}


def test_values_are_read_at_every_call_even_when_the_checks_are_remembered(kv):
    g = mx.nd.ones((4,))
    first = pushed(kv._plan("pushpull", [(1, g)]))[1, 0]
    g[:] = 5                                   # the same array, a new gradient
    second = pushed(kv._plan("pushpull", [(1, g)]))[1, 0]
    assert np.array_equal(first, np.ones(4)) and np.array_equal(second, np.full(4, 5))


@pytest.mark.parametrize("value,message", [
    (mx.nd.ones((3, 2)), "key 0: pushed shape (3, 2), but the key was initialised with shape (2, 3)"),
    (mx.nd.ones((2, 3), dtype="float64"),
     "key 0: pushed dtype float64, but the key was initialised as float32"),
])
def test_a_wrong_value_is_refused_before_anything_is_read(kv, value, message):
    good = mx.nd.ones((4,))
    with pytest.raises(KVStoreError) as err:
        kv._plan("pushpull", [(1, good), (0, value)])
    assert str(err.value) == message
    assert all(lane._used == 0 for lane in kv._staging.values())


def test_an_unknown_key_is_refused(kv):
    with pytest.raises(KVStoreError, match="key 99 has not been initialised"):
        kv._plan("pushpull", [(99, mx.nd.ones((4,)))])


def test_an_array_that_replaces_a_checked_one_is_checked_again(kv):
    good = mx.nd.ones((4,))
    kv._plan("pushpull", [(1, good)])
    with pytest.raises(KVStoreError, match=r"pushed shape \(5,\)"):
        kv._plan("pushpull", [(1, mx.nd.ones((5,)))])
    assert np.array_equal(pushed(kv._plan("pushpull", [(1, good)]))[1, 0], np.ones(4))


def test_a_parameter_initialised_anew_brings_new_arrays_that_are_read(kv):
    """gluon.Trainer passes the same gradient arrays every step; a parameter initialised
    again gets new ones, whose values must be what is sent."""
    net = gluon.nn.Dense(2, in_units=2, use_bias=False)
    net.initialize(mx.init.Constant(1.0))
    kv._meta = {0: ((2, 2), F32)}
    param = net.weight
    old = param.list_grad()
    old[0][:] = 3
    assert np.array_equal(pushed(kv._plan("pushpull", [(0, old)]))[0, 0], np.full(4, 3))
    assert kv._checked.get((0, "value"), old) is not None
    net.initialize(mx.init.Constant(2.0), force_reinit=True)
    new = param.list_grad()
    assert new[0] is not old[0] and kv._checked.get((0, "value"), new) is None
    new[0][:] = 4
    assert np.array_equal(pushed(kv._plan("pushpull", [(0, new)]))[0, 0], np.full(4, 4))
    assert kv._checked.get((0, "value"), new) is not None


def test_outputs_are_checked_once_and_ordered_as_mxnet_writes_them(kv):
    kv._meta[3] = ((4,), F32)
    a, b = mx.nd.zeros((4,)), mx.nd.zeros((4,))
    out = kv._targets([(3, a), (1, [b, a])])   # a twice: ascending keys
    assert [(k, o is a) for k, o in out.targets] == [(1, False), (1, True), (3, True)]
    assert [o is a for o in out.distinct] == [False, True] and out.in_engine
    assert [(k, d.array is a) for k, d in out.placed()] == [(1, False), (1, True), (3, True)]
    kind = out.kinds[a.handle.value]
    assert (kind.shape, kind.dtype, kind.on_cpu) == ((4,), F32, True)
    assert kv._checked.get((1, "out"), [b, a]) is not None
    with pytest.raises(KVStoreError, match=r"key 1: out has shape \(2, 3\), but the key has "
                                           r"shape \(4,\)"):
        kv._targets([(1, mx.nd.zeros((2, 3)))])


def test_a_sparse_array_is_refused_by_name_after_dense_ones_have_passed(kv):
    """The storage type is asked only of arrays not seen before (an array keeps its type),
    so a sparse one that takes the place of a dense one is still refused, naming the key."""
    dense, out = mx.nd.ones((4,)), mx.nd.zeros((4,))
    kv._plan("pushpull", [(1, dense)])
    kv._targets([(1, out)])
    with pytest.raises(KVStoreError, match="key 1: the pushed value has row_sparse storage"):
        kv._plan("pushpull", [(1, mx.nd.ones((4,)).tostype("row_sparse"))])
    with pytest.raises(KVStoreError, match="key 1: the out array has csr storage"):
        kv._targets([(1, mx.nd.zeros((1, 4)).tostype("csr"))])
    assert np.array_equal(pushed(kv._plan("pushpull", [(1, dense)]))[1, 0], np.ones(4))


def test_a_call_repeated_with_the_same_arrays_is_planned_as_a_fresh_one(kv):
    """A list call kept (its checks and blocks) serves the same call again: the same items,
    the values read anew; any change of key, array or order is checked from scratch."""
    kv._meta[3] = ((4,), F32)
    g0, g1, g3 = mx.nd.arange(6).reshape((2, 3)), mx.nd.ones((4,)), mx.nd.zeros((4,))
    call = [(0, g0), (1, [g1, g3]), (3, g3)]
    first = kv._plan("pushpull", call)
    assert kv._same.get("pushpull", call) is not None
    g1[:] = 7
    again = kv._plan("pushpull", list(call))
    fresh = ParameterServerStore()
    fresh._meta[3] = ((4,), F32)
    assert {s: its for s, (its, _, _) in again.items()} == \
        {s: its for s, (its, _, _) in fresh._plan("pushpull", call).items()} == \
        {s: its for s, (its, _, _) in first.items()}
    assert np.array_equal(pushed(again)[1, 0], np.full(4, 7)) and \
        np.array_equal(pushed(first)[1, 0], np.ones(4))
    with pytest.raises(KVStoreError, match=r"key 1: pushed shape \(2, 2\)"):
        kv._plan("pushpull", [(0, g0), (1, [g1, mx.nd.ones((2, 2))]), (3, g3)])
    with pytest.raises(KVStoreError, match="key 2: pushed dtype float32"):
        kv._plan("pushpull", [(0, g0), (2, mx.nd.ones((2, 2))), (3, g3)])
    with pytest.raises(TypeError, match="kvstore keys are int or str, got True"):
        kv._plan("pushpull", [(0, g0), (True, [g1, g3]), (3, g3)])
    swapped = kv._plan("pushpull", [(3, g3), (0, g0), (1, [g1, g3])])
    assert swapped[1][0][0] == [3, 0, "<f4", 4]


def test_a_call_made_again_copies_and_cuts_its_gradients_as_worked_out_once(kv):
    """From its second time on, a call of single-device, uncut keys is staged the way worked
    out then (StagedCall): each server receives what a fresh store's call sends, the values
    of the moment, in fresh bytes (an earlier message, perhaps still in flight, keeps its
    own); a call with a key it cannot serve so (pulled only) goes the plain way."""
    kv._part = Partitioner(2, bigarray_bound=10**6)
    kv._meta = {1: ((4,), F32), 2: ((64, 64), np.dtype("float64")), 3: ((20000,), F32)}
    g1, g2, g3 = mx.nd.array([1, 2, 3, 4]), mx.nd.ones((64, 64), dtype="float64"), mx.nd.zeros((20000,))
    call = [(1, g1), (2, g2), (3, g3)]
    first = kv._plan("pushpull", call)
    assert kv._same.get("pushpull", call).messages is None          # not worked out yet
    second = kv._plan("pushpull", call)
    assert sorted(kv._same.get("pushpull", call).messages) == [0, 1]
    g1[:] = 9
    g2[:] = 0.5
    third = kv._plan("pushpull", call)
    fresh = ParameterServerStore()
    fresh._part, fresh._meta = kv._part, kv._meta
    want = fresh._plan("pushpull", call)
    for plan in (first, second, third):
        assert {s: (its, where) for s, (its, _, where) in plan.items()} == \
            {s: (its, where) for s, (its, _, where) in want.items()}
    for plan, v1, v2 in ((first, [1, 2, 3, 4], 1.0), (second, [1, 2, 3, 4], 1.0),
                         (third, [9] * 4, 0.5)):
        values = pushed(plan)
        assert np.array_equal(values[1, 0], v1) and np.array_equal(values[2, 0], np.full(4096, v2))
        assert np.array_equal(values[3, 0], np.zeros(20000))
    assert third[1][0] is not second[1][0]                 # a new list (dist_psp's replaced)
    pulled = [(1, None), (3, None)]
    kv._plan("pull", pulled)
    assert kv._plan("pull", pulled) == {1: ([[1, 0, "<f4", 4], [3, 0, "<f4", 20000]], [],
                                            kv._plan("pull", pulled)[1][2])}
    assert kv._same.get("pull", pulled).messages == {}


def test_a_pull_and_a_push_keep_one_call_each(kv):
    g = mx.nd.ones((4,))
    kv._plan("pushpull", [(1, g)])
    kv._plan("pull", [(1, None)])
    assert kv._same.get("pushpull", [(1, g)]) is not None
    assert kv._same.get("pull", [(1, None)]) is not None
    assert kv._same.get("pull", [(1, g)]) is None and kv._same.get("pushpull", [(1, None)]) is None


@pytest.mark.parametrize("shape", [(16, 16, 3, 3), (8, 3, 3, 3)])
def test_a_kept_destination_writes_weights_an_inference_pass_put_in_mkldnn_layout(kv, shape):
    """MXNet's MKL-DNN convolution, outside training, moves its weight array into a layout of
    its own; values written there in the default layout would be read scrambled (the raw
    write below shows that it happens here).  A destination kept from an earlier call asks
    MXNet for the array's memory again, which brings the array back first."""
    w = mx.nd.random.uniform(shape=shape)
    kv._meta[5] = (shape, F32)
    kinds = kv._targets([(5, w)]).kinds
    first = kinds[w.handle.value].place(w)
    values = np.arange(w.size, dtype=np.float32)

    def convolve():
        x = mx.nd.random.uniform(shape=(1, shape[1], 8, 8))
        mx.nd.Convolution(x, w, num_filter=shape[0], kernel=(3, 3), no_bias=True).wait_to_read()

    convolve()
    first.write([(0, w.size, values)])                 # unchecked: scrambled
    assert not np.array_equal(w.asnumpy().reshape(-1), values)
    convolve()
    kinds = kv._targets([(5, w)]).kinds
    again = kinds[w.handle.value].place(w)
    assert again is first                              # the memory did not move
    again.write([(0, w.size, values)])
    assert np.array_equal(w.asnumpy().reshape(-1), values)
    other = mx.nd.zeros(shape)
    kinds = kv._targets([(5, other)]).kinds
    assert kinds[other.handle.value].place(other).array is other


# -- writing weights back through MXNet's engine -----------------------------------------------------
def test_an_asynchronous_operation_holds_readers_until_it_is_told_to_end():
    a = mx.nd.zeros((3,))
    destination = engine.Destination(a)
    ends = []
    engine.push_async(ends.append, [a])
    deadline = time.monotonic() + 5
    while not ends and time.monotonic() < deadline:
        time.sleep(0.001)
    assert ends, "the engine did not start the operation"

    def finish():
        time.sleep(0.2)
        destination.write([(0, 3, np.array([1.0, 2.0, 3.0]))])
        ends[0]()
        ends[0]()                                  # a second call is ignored

    t0 = time.monotonic()
    threading.Thread(target=finish).start()
    assert a.asnumpy().tolist() == [1.0, 2.0, 3.0]
    assert time.monotonic() - t0 >= 0.15


def test_one_write_back_ends_the_operations_of_all_its_calls():
    """Per-key calls of one round: an operation each, one wait, the last call wins."""
    a, b = mx.nd.zeros((2,)), mx.nd.zeros((2,))
    release, fetches, failures = threading.Event(), [], []

    def fetch():
        fetches.append(1)
        assert release.wait(5)
        return {"k1": [(0, 2, np.array([1.0, 1.0]))], "k2": [(0, 2, np.array([2.0, 2.0]))],
                "k3": [(0, 2, np.array([3.0, 3.0]))]}

    round_ = WriteBack(fetch, failures.append)
    for key, array in (("k1", a), ("k2", b), ("k3", a)):    # a is written by two calls
        engine.push_async(lambda done, t=[(key, engine.Destination(array))]:
                          round_.start(t, done), [array])
    time.sleep(0.1)
    assert fetches == [1]                      # the first operation waits, the others do not
    release.set()
    assert a.asnumpy().tolist() == [3.0, 3.0] and b.asnumpy().tolist() == [2.0, 2.0]
    assert fetches == [1] and failures == []


def test_a_write_back_armed_on_its_replies_holds_no_engine_thread():
    """With ``arm``, the first operation returns at once; the thread that brings the last
    reply writes every operation started by then and ends them, and a later one writes its
    own.  An arm that cannot (or raises) leaves the wait on the engine thread, as before."""
    a, b, c = mx.nd.zeros((2,)), mx.nd.zeros((2,)), mx.nd.zeros((2,))
    tickets = [Ticket(), Ticket()]
    threads, failures = [], []

    def fetch():
        threads.append(threading.current_thread().name)
        assert all(t.event.is_set() for t in tickets), "fetch would have waited"
        return {"k1": [(0, 2, np.array([1.0, 1.0]))], "k2": [(0, 2, np.array([2.0, 2.0]))]}

    round_ = WriteBack(fetch, failures.append, functools.partial(when_answered, tickets))
    for key, array in (("k1", a), ("k2", b)):
        engine.push_async(lambda done, t=[(key, engine.Destination(array))]:
                          round_.start(t, done), [array])
    engine.push(lambda: None, [c])      # the engine's threads are free meanwhile
    c.wait_to_read()
    assert threads == [] and round_.since is not None
    tickets[0].fulfil({"ok": True}, [])
    answer = threading.Thread(target=tickets[1].fulfil, args=({"ok": True}, []), name="replies")
    answer.start()
    answer.join()
    assert threads == ["replies"]                    # one fetch, on the answering thread
    assert a.asnumpy().tolist() == [1.0, 1.0] and b.asnumpy().tolist() == [2.0, 2.0]
    engine.push_async(lambda done: round_.start([("k2", engine.Destination(c))], done), [c])
    assert c.asnumpy().tolist() == [2.0, 2.0] and threads == ["replies"] and failures == []

    for arm in (lambda callback: False, lambda callback: 1 / 0):
        d, release = mx.nd.zeros((2,)), threading.Event()

        def waits():
            assert release.wait(5)
            return {"k": [(0, 2, np.array([5.0, 5.0]))]}

        blocking = WriteBack(waits, failures.append, arm)
        engine.push_async(lambda done: blocking.start([("k", engine.Destination(d))], done), [d])
        threading.Timer(0.1, release.set).start()
        assert d.asnumpy().tolist() == [5.0, 5.0] and failures == []


def test_a_failed_request_ends_an_armed_write_back_with_its_error():
    """A reply that never comes because the job failed: the tickets fail, the write-back's
    error reaches ``fail`` and its operations end without writing."""
    a = mx.nd.ones((2,))
    ticket, failures = Ticket(), []

    def fetch():
        raise KVStoreError(ticket.error)

    round_ = WriteBack(fetch, failures.append, functools.partial(when_answered, [ticket]))
    engine.push_async(lambda done: round_.start([("k", engine.Destination(a))], done), [a])
    ticket.fail("server 0 is gone")
    assert a.asnumpy().tolist() == [1.0, 1.0]
    assert [str(f) for f in failures] == ["server 0 is gone"]


def test_a_repeated_per_key_call_is_the_same_arrays_only():
    """What lets a per-key pushpull skip its checks: the very gradient and out arrays of the
    last call of the key, bare or as lists of one; anything else goes the checked way."""
    g, w = mx.nd.ones((2, 3)), mx.nd.zeros((2, 3))
    kept = RepeatedCall(0, [g], w, 0, None)
    assert kept.matches(g, w) and kept.matches([g], [w]) and kept.matches((g,), w)
    assert not kept.matches(mx.nd.ones((2, 3)), w)          # another gradient array
    assert not kept.matches(g, mx.nd.zeros((2, 3)))          # another out array
    assert not kept.matches(g, g)                            # in place
    assert not kept.matches([g, g], w) and not kept.matches(g, [w, w])
    assert not kept.matches([], w)

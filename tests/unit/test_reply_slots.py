"""Per-key calls served from reply slots, in MXNet's real engine: one operation per round
writes the slots, MXNet's copies write the weights, in the order the calls were made."""
import threading

import mxnet as mx
import numpy as np

from kvstore_ext import engine
from kvstore_ext.ps.batching import Batch, WriteBack
from kvstore_ext.ps.store import ReplySlots

SHAPE, DTYPE = (3, 4), np.dtype("float32")
META = (SHAPE, DTYPE)


class Round:
    """A batch whose replies the test releases: ``values`` per key, or ``error``."""

    def __init__(self, values=None, error=None):
        self.release = threading.Event()
        self.failures = []
        self.values, self.error = values or {}, error
        self.batch = Batch("pushpull")
        self.batch.write_back = WriteBack(self._fetch, self.failures.append)

    def _fetch(self):
        assert self.release.wait(10), "the round's values were never released"
        if self.error is not None:
            raise self.error
        return {k: [(0, v.size, v.reshape(-1))] for k, v in self.values.items()}


def call(slots, r, key, weight):
    """One per-key call, as the store makes it: the slot's copy, or an operation of its own."""
    if slots.copy_out(r.batch, key, [weight], META):
        return True
    targets = [(key, engine.Destination(weight, SHAPE, DTYPE))]
    engine.push_async(lambda done: r.batch.write_back.start(targets, done), [weight])
    return False


def full(value):
    return np.full(SHAPE, value, DTYPE)


def warmed(values):
    """Slots and weights after a first round that wrote ``values`` (key -> number): from
    the next round on, every key is served from its slot."""
    slots = ReplySlots()
    w = {k: mx.nd.array(full(0)) for k in values}
    warm = Round({k: full(v) for k, v in values.items()})
    for k in values:
        assert not call(slots, warm, k, w[k])
    warm.release.set()
    return slots, w


def test_a_key_is_served_from_its_slot_from_its_second_round_on():
    slots = ReplySlots()
    w = {k: mx.nd.array(full(k)) for k in (0, 1)}
    first = Round({0: full(10), 1: full(11)})
    assert [call(slots, first, k, w[k]) for k in (0, 1)] == [False, False]
    first.release.set()
    assert [w[k].asnumpy()[0, 0] for k in (0, 1)] == [10, 11]
    second = Round({0: full(20), 1: full(21)})
    assert [call(slots, second, k, w[k]) for k in (0, 1)] == [True, True]
    second.release.set()
    assert [w[k].asnumpy()[0, 0] for k in (0, 1)] == [20, 21]
    assert first.failures == second.failures == []


def test_a_write_between_two_calls_of_a_round_is_ordered_as_the_calls_were():
    """The round's operation is pushed at its first call; a user's write of a later key's
    weights between the calls must still come before that key's reply is written."""
    slots, w = warmed({0: 1, 1: 1})
    r = Round({0: full(5), 1: full(6)})
    call(slots, r, 0, w[0])
    w[1][:] = 99                     # after the round's operation was pushed
    call(slots, r, 1, w[1])
    r.release.set()
    assert w[0].asnumpy()[0, 0] == 5 and w[1].asnumpy()[0, 0] == 6


def test_readers_of_the_weights_wait_for_the_round():
    slots, w = warmed({0: 1})
    w = w[0]
    r = Round({0: full(7)})
    call(slots, r, 0, w)
    read = (w * 2)                   # pushed now: must see the round's value
    threading.Timer(0.2, r.release.set).start()
    assert read.asnumpy()[0, 0] == 14


def test_a_failed_round_leaves_the_weights_as_the_last_round_left_them():
    slots, w = warmed({0: 3})
    w = w[0]
    ok2 = Round({0: full(4)})
    call(slots, ok2, 0, w)
    ok2.release.set()
    failed = Round(error=ConnectionError("server 0 lost"))
    assert call(slots, failed, 0, w)
    failed.release.set()
    assert w.asnumpy()[0, 0] == 4
    assert [str(e) for e in failed.failures] == ["server 0 lost"]


def test_arrays_not_of_the_keys_shape_and_dtype_are_written_by_their_own_operation():
    slots = ReplySlots()
    w = mx.nd.zeros(SHAPE, dtype="float64")
    for value in (1, 2):
        r = Round({0: full(value).astype("float64")})
        assert not slots.copy_out(r.batch, 0, [w], META)
        targets = [(0, engine.Destination(w))]
        engine.push_async(lambda done, r=r, t=targets: r.batch.write_back.start(t, done), [w])
        r.release.set()
        assert w.asnumpy()[0, 0] == value


def test_a_round_without_a_key_leaves_its_slot_and_weights_alone():
    """A batch sent before a key joined it (the next call of that key joins the next batch)."""
    slots, w = warmed({0: 1, 1: 2})
    early = Round({0: full(8)})          # key 1 never joined it
    call(slots, early, 0, w[0])
    early.release.set()
    late = Round({1: full(9)})
    call(slots, late, 1, w[1])
    late.release.set()
    assert w[0].asnumpy()[0, 0] == 8 and w[1].asnumpy()[0, 0] == 9


def test_a_new_weight_array_for_a_key_gets_the_copy_and_the_old_one_is_left():
    """A parameter initialised anew brings new arrays: the copy follows the call's arrays."""
    slots, w = warmed({0: 1})
    old, new = w[0], mx.nd.array(full(0))
    r = Round({0: full(2)})
    assert call(slots, r, 0, old)
    r.release.set()
    r = Round({0: full(3)})
    assert call(slots, r, 0, new)
    r.release.set()
    assert old.asnumpy()[0, 0] == 2 and new.asnumpy()[0, 0] == 3


def test_an_array_of_another_dtype_after_the_slot_is_made_is_written_by_its_own_operation():
    slots, w = warmed({0: 1})
    other = mx.nd.zeros(SHAPE, dtype="float64")
    r = Round({0: full(4)})
    assert not slots.copy_out(r.batch, 0, [other], META)
    targets = [(0, engine.Destination(other))]
    engine.push_async(lambda done: r.batch.write_back.start(targets, done), [other])
    r.release.set()
    assert other.asnumpy()[0, 0] == 4 and w[0].asnumpy()[0, 0] == 1

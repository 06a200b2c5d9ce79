"""The pure logic of a worker's round: staging layout, remembered checks, one write-back pass."""
import threading

import numpy as np
import pytest

from kvstore_ext.ps.batching import CheckedArrays, Coalescer, SameCall, Staging, WriteBack
from kvstore_ext.ps.protocol import ALIGN, layout


# -- staging --------------------------------------------------------------------------------------
def test_layout_aligns_every_segment():
    offsets, total = layout([4, 0, 100, 64])
    assert ALIGN == 8     # any dtype's alignment, and no gap between float32 arrays of even size
    assert offsets == [0, 8, 8, 112]
    assert total == 176 and all(o % ALIGN == 0 for o in offsets)


def base_address(segment):
    return segment.__array_interface__["data"][0]


def test_a_calls_segments_lie_side_by_side_in_one_buffer():
    staging = Staging(chunk_bytes=1024)
    a, b, c = staging.take([12, 200, 8])
    assert [s.nbytes for s in (a, b, c)] == [12, 200, 8]
    assert a.base is b.base is c.base
    start = base_address(a)
    assert [base_address(s) - start for s in (a, b, c)] == layout([12, 200, 8])[0]


def test_staged_bytes_are_never_handed_out_twice():
    """A message's buffers may still be on their way when the next call comes."""
    staging = Staging(chunk_bytes=1024)
    first = staging.take([400, 400])
    second = staging.take([300])                    # does not fit: a new buffer
    third = staging.take([10])
    for x in first:
        x[:] = 1
    for s in (*second, *third):
        s[:] = 2
    assert all((x == 1).all() for x in first)
    assert second[0].base is not first[0].base and third[0].base is second[0].base


def test_a_call_larger_than_a_buffer_gets_one_of_its_own():
    staging = Staging(chunk_bytes=1024)
    (big,) = staging.take([5000])
    assert big.nbytes == 5000 and big.base.nbytes == -(-5000 // ALIGN) * ALIGN


def test_a_pull_takes_nothing():
    staging = Staging(chunk_bytes=1024)
    assert staging.take([]) == []


# -- checks remembered per key ------------------------------------------------------------------------
class Handle:
    def __init__(self, value):
        self.value = value


class Array:
    """What CheckedArrays looks at: the object and its handle."""

    def __init__(self, handle):
        self.handle = Handle(handle)


def test_the_same_arrays_are_not_checked_again():
    checked = CheckedArrays()
    g0, g1 = Array(1), Array(2)
    assert checked.get((0, "value"), [g0, g1]) is None
    checked.put((0, "value"), [g0, g1], "facts")
    assert checked.get((0, "value"), [g0, g1]) == "facts"
    assert checked.get((0, "out"), [g0, g1]) is None      # another role, another entry
    assert checked.get((1, "value"), [g0, g1]) is None    # another key


def test_another_array_for_a_key_is_checked_again_and_replaces_the_entry():
    """A Trainer made anew keeps the arrays (still known); a parameter initialised anew
    brings new arrays, and an array whose handle changed is not the array that was checked."""
    checked = CheckedArrays()
    g = Array(1)
    checked.put(0, [g], "old")
    assert checked.get(0, [Array(1)]) is None             # same handle, another object
    assert checked.get(0, [g, g]) is None                 # another number of devices
    g.handle = Handle(7)
    assert checked.get(0, [g]) is None
    fresh = Array(3)
    checked.put(0, [fresh], "new")
    assert checked.get(0, [fresh]) == "new" and checked.get(0, [g]) is None


def test_a_call_is_the_same_only_with_the_same_keys_and_arrays_in_order():
    same = SameCall()
    g0, g1, w = Array(1), Array(2), Array(3)
    call = [(0, g0), (1, [g1, w]), ("k", None)]
    assert same.get("pushpull", call) is None
    same.put("pushpull", call, "plan")
    assert same.get("pushpull", [(0, g0), (1, [g1, w]), ("k", None)]) == "plan"
    assert same.get("pushpull", [(0, g0), (1, (g1, w)), ("k", None)]) == "plan"
    assert same.get("pull", call) is None                               # another kind
    for other in ([(0, g0), (1, [g1, w])],                              # a key fewer
                  [(1, [g1, w]), (0, g0), ("k", None)],                 # another order
                  [(0, g0), (1, [w, g1]), ("k", None)],                 # devices swapped
                  [(0, g0), (1, [g1]), ("k", None)],
                  [(0, Array(1)), (1, [g1, w]), ("k", None)],           # same handle, new array
                  [(0, g0), (1, [g1, w]), ("k", g0)],                   # a value where none was
                  [(True, g0), (1, [g1, w]), ("k", None)],              # equal, not the same key
                  [(0.0, g0), (1, [g1, w]), ("k", None)]):
        assert same.get("pushpull", other) is None, other
    g0.handle = Handle(9)                                               # a handle changed
    assert same.get("pushpull", call) is None
    same.put("pushpull", [(0, g1)], "other")             # one entry per kind and first key
    assert same.get("pushpull", [(0, g1)]) == "other" and same.get("pushpull", call) is None
    same.put("pushpull", [(1, g1)], "per key")
    assert same.get("pushpull", [(1, g1)]) == "per key" and same.get("pushpull", [(0, g1)])
    assert same.get("pushpull", [([0], g1)]) is None                    # unhashable: not kept


# -- writing a round's values back ----------------------------------------------------------------------
class Destination:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def write(self, parts):
        if parts == "misfit":
            raise ValueError(f"{self.name} does not fit")
        self.log.append((self.name, parts))


class Round:
    """A write-back whose values the test releases, recording what happens."""

    def __init__(self, values=None, error=None):
        self.release = threading.Event()
        self.fetching = threading.Event()       # an operation is waiting for the values
        self.fetches, self.failures, self.log, self.ended = 0, [], [], []
        self.values, self.error = values or {}, error
        self.write_back = WriteBack(self.fetch, self.failures.append)

    def fetch(self):
        self.fetches += 1
        self.fetching.set()
        assert self.release.wait(5)
        if self.error is not None:
            raise self.error
        return self.values

    def start(self, name, key):
        """What one call's engine operation does when MXNet starts it."""
        self.write_back.start([(key, Destination(self.log, name))],
                              lambda: self.ended.append(name))


def test_the_first_operation_waits_and_writes_every_call_started_meanwhile():
    r = Round({"k1": [(0, 1, "v1")], "k2": [(0, 1, "v2")], "k3": [(0, 1, "v3")]})
    waiter = threading.Thread(target=r.start, args=("a1", "k1"))
    waiter.start()
    assert r.fetching.wait(5)                 # the waiter is the first operation
    r.start("a2", "k2")                        # returns at once: no thread held
    assert r.log == [] and r.ended == []
    r.release.set()
    waiter.join(5)
    assert r.log == [("a1", [(0, 1, "v1")]), ("a2", [(0, 1, "v2")])]
    assert r.ended == ["a1", "a2"] and r.fetches == 1
    r.start("a3", "k3")                        # started after the values came: written at once
    assert r.log[-1] == ("a3", [(0, 1, "v3")]) and r.ended[-1] == "a3" and r.fetches == 1


def test_a_key_without_values_keeps_its_array():
    """A partial pull brings some blocks: an array without any is left as it is."""
    r = Round({})
    r.release.set()
    r.start("a", "k")
    assert r.log == [("a", ())] and r.ended == ["a"]


def test_a_failed_round_ends_every_operation_unwritten_and_reports_once():
    r = Round(error=ConnectionError("server gone"))
    waiter = threading.Thread(target=r.start, args=("a1", "k1"))
    waiter.start()
    assert r.fetching.wait(5)                 # the waiter is the first operation
    r.start("a2", "k2")
    r.release.set()
    waiter.join(5)
    r.start("a3", "k3")
    assert r.log == [] and r.ended == ["a1", "a2", "a3"]
    assert [str(e) for e in r.failures] == ["server gone"]


def test_a_value_that_does_not_fit_is_reported_and_the_others_are_written():
    r = Round({"bad": "misfit", "good": [(0, 1, "v")]})
    r.release.set()
    r.start("b", "bad")
    r.start("g", "good")
    assert r.log == [("g", [(0, 1, "v")])] and r.ended == ["b", "g"]
    assert [str(e) for e in r.failures] == ["b does not fit"]


def test_a_batch_gets_its_write_back_as_it_opens():
    made = []
    coalescer = Coalescer(lambda messages: {0: "ticket"},
                          write_back=lambda batch: made.append(batch) or f"wb{len(made)}")
    plan = {0: ([["k", 0, "<f4", 1]], [b"x"], ["k"])}
    first = coalescer.add("pushpull", "k", plan)
    assert first.write_back == "wb1" and coalescer.add("pushpull", "j", plan) is first
    second = coalescer.add("pushpull", "k", plan)          # k again: a new batch
    assert second is not first and second.write_back == "wb2" and made == [first, second]


@pytest.mark.parametrize("calls", [2, 40])
def test_operations_started_from_many_threads_are_each_ended_once(calls):
    r = Round({f"k{i}": [(0, 1, i)] for i in range(calls)})
    threads = [threading.Thread(target=r.start, args=(f"a{i}", f"k{i}")) for i in range(calls)]
    for t in threads:
        t.start()
    r.release.set()
    for t in threads:
        t.join(5)
    assert sorted(r.ended) == sorted(f"a{i}" for i in range(calls)) and r.fetches == 1
    assert sorted(name for name, _ in r.log) == sorted(r.ended)
    assert np.array_equal(sorted(p[0][2] for _, p in r.log), range(calls))

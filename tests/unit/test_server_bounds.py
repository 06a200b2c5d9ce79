"""What a server keeps for a worker that does not wait, from a holder of the job's secret:
pushes ahead of the round and inits that wait.  A real server's request handling, in process
(``server_harness``), driven with the requests such a peer sends."""
import numpy as np
import pytest

from kvstore_ext.ps import server as S
from server_harness import buffers_of, install, items_of, make_server


@pytest.fixture(autouse=True)
def _clock(monkeypatch):
    install(monkeypatch)


def push(s, seq, worker, keys, value=1.0):
    grads = [np.full(s.slots[(k, 0)].size, value, np.float32) for k in keys]
    s.op_push(b"x", {"op": "push", "seq": seq, "worker": worker, "items": items_of(s, keys)},
              buffers_of(grads))


def test_pushes_ahead_of_the_round_are_held_up_to_twice_the_window():
    """dist_bsp, worker 1 has not pushed: worker 0's next pushes are held for later rounds.
    A peer sending 1,500 pushes of 1 MB made the server hold 1.5 GB; now what it holds for one
    worker stops at twice the window, the push over it is refused by name, and the rounds go
    on with what was held."""
    s = make_server("dist_bsp", {}, 2, True, [262_144], [np.float32])
    s.env.window_bytes = 4 << 20
    push(s, 1, 0, [0])                          # round 1's push
    held = 0
    with pytest.raises(S.RequestError, match="pushed ahead of the round more than the server "
                                             "holds for it: 8 pushes of 8388608 bytes"):
        for seq in range(2, 100):
            push(s, seq, 0, [0])
            held += 1
    assert held == 8 and s.held_of[0] == [8, 8 << 20]
    push(s, 200, 1, [0])                        # round 1 ends; round 2 takes a held push
    assert s.held_of[0] == [7, 7 << 20]
    assert s.slots[(0, 0)].version == 1


def test_a_single_push_larger_than_the_window_is_taken():
    s = make_server("dist_bsp", {}, 2, True, [262_144], [np.float32])
    s.env.window_bytes = 1 << 19                # 0.5 MB: one push of 1 MB still fits
    push(s, 1, 0, [0])
    push(s, 2, 0, [0])                          # held, the first for the worker
    assert s.held_of[0] == [1, 1 << 20]


def test_many_small_pushes_ahead_are_bounded_by_count(monkeypatch):
    monkeypatch.setattr(S, "MAX_HELD_PUSHES", 50)
    s = make_server("dist_bsp", {}, 2, True, [1], [np.float32])
    push(s, 1, 0, [0])
    with pytest.raises(S.RequestError, match="50 pushes"):
        for seq in range(2, 100):
            push(s, seq, 0, [0])
    assert s.held_of[0][0] == 50
    s.remove_worker(0)
    assert 0 not in s.held_of


def test_inits_waiting_and_blocks_declared_without_values_are_bounded(monkeypatch):
    """A peer declaring 50,000 new keys an init without values (as a worker other than 0
    does before worker 0's values come) grew a server by 800 MB in 20 s; now such blocks stop
    at MAX_DECLARED_BLOCKS and each worker may have one waiting init per store."""
    monkeypatch.setattr(S, "MAX_DECLARED_BLOCKS", 1_000)
    s = make_server("dist_bsp", {}, 2, True, [4], [np.float32])
    s.at = lambda due, callback: None
    s.reply = lambda *args, **kwargs: None

    def init(seq, first, count):
        s.op_init(b"x", {"op": "init", "seq": seq, "worker": 1, "has_value": False,
                         "items": [[k, 0, "<f4", [4], 4] for k in range(first, first + count)]},
                  [])
    init(1, 100, 600)
    with pytest.raises(S.RequestError, match="declares 600 more blocks, but .* already wait for worker 0's values"):
        init(2, 1_000, 600)
    assert len(s.init_declared) == 600 and len(s.init_waiting) == 1
    for seq in range(3, 3 + S.MAX_STORES_PER_WORKER - 1):
        init(seq, 100, 1)                       # the same key again: nothing new declared
    with pytest.raises(S.RequestError, match="inits waiting on this server"):
        init(999, 100, 1)

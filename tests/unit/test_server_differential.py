"""The server's groups of blocks against per-block policies, in process: two servers driven
with the same random whole-model and partial requests (a worker leaving, joining) agree on
every reply, weight, version and metric; and a worker pool's learning rate follows the pool
of the blocks being updated, not one of blocks never pushed."""
import math

import mxnet as mx
import numpy as np
import pytest

from server_harness import buffers_of, compare, install, make_server, run, weights


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    return install(monkeypatch)


def sgd():
    return mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-3)


CASES = [("dist_bsp", {}, None), ("dist_bsp", {}, sgd), ("dist_ssp", {"staleness": 1}, sgd),
         ("dist_ssp", {"staleness": 0}, None),
         ("dist_dssp", {"staleness_lower": 1, "staleness_upper": 3, "rule": "bounded"}, sgd),
         ("dist_asp", {}, sgd)]


@pytest.mark.parametrize("store,params,optimizer", CASES,
                         ids=[f"{c[0]}-{'sgd' if c[2] else 'sum'}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("seed", range(2))
def test_groups_answer_as_per_block_policies_do(store, params, optimizer, seed):
    grouped, per_block = run(store, params, seed, optimizer=optimizer)
    assert compare(grouped, per_block) == []
    assert len(grouped.sent) > 300


@pytest.mark.parametrize("store,params,optimizer", CASES[1::2])
def test_whole_model_requests_keep_one_group(store, params, optimizer):
    grouped, per_block = run(store, params, 0, optimizer=optimizer, partial=0.0)
    assert compare(grouped, per_block) == []
    assert len(grouped.groups) == 1 and len(per_block.groups) == 7


def test_workers_joining_an_async_job_see_the_same_weights(monkeypatch):
    grouped, per_block = run("dist_ssp", {"staleness": 2}, 0, workers=3, optimizer=sgd,
                             join=True)
    assert compare(grouped, per_block) == []


POOL = {"pool": "progressive", "pool_start": 1, "pool_min": 1, "pool_every": 0.5, "tune": "l",
        "tune_k": 0.5, "batch_size": 4, "epoch_samples": 8}


def test_a_pools_learning_rate_is_the_one_of_the_pushed_blocks_not_of_a_frozen_one():
    """Keys 0 and 2 are trained, key 1 is never pushed (grad_req='null', a frozen layer): the
    rate the server applies is the one its OK tells the worker."""
    s = make_server("dist_pool", POOL, 4, True, [6, 6, 6], [np.float32] * 3,
                    lambda: mx.optimizer.SGD(learning_rate=1.0))
    for seq in range(1, 9):
        s.op_push(b"x", {"op": "pushpull", "seq": seq, "worker": 0,
                         "items": [[0, 0, "<f4", 6], [2, 0, "<f4", 6]]},
                  buffers_of([np.ones(6, np.float32)] * 2))
        s.send_value_replies()
    trained = s.slots[(0, 0)].group.policy.pool
    assert trained.size > 1 and s.pool_policy.pool is trained
    told = s.sent[8][4]["lr"]
    assert told < 1.0 and math.isclose(s.optimizer.optimizer.lr, told)


def test_a_split_groups_rate_is_its_own_pools():
    """Key 0 is pushed on its own (a split), then key 1 three times (its pool grows to 3
    workers), then key 0 again: key 0's update uses key 0's pool, as a per-block pool would."""
    params = {"pool": "scripted", "pool_schedule": "0:1,1.5:3", "tune": "l", "tune_k": 0.5,
              "batch_size": 4, "epoch_samples": 8, "pool_start": 1, "pool_min": 1}
    moved = {}
    for grouped in (True, False):
        s = make_server("dist_pool", params, 3, grouped, [4, 4], [np.float32] * 2,
                        lambda: mx.optimizer.SGD(learning_rate=1.0, momentum=0.0))
        for seq, keys in enumerate([[0], [1], [1], [1], [0]], 1):
            s.op_push(b"x", {"op": "push", "seq": seq, "worker": 0,
                             "items": [[k, 0, "<f4", 4] for k in keys]},
                      buffers_of([np.ones(4, np.float32) for _ in keys]))
            s.send_value_replies()
        moved[grouped] = weights(s)[0]
    np.testing.assert_array_equal(moved[True], moved[False])


def test_a_worker_taken_into_the_pool_gets_every_reply_it_waited_for(monkeypatch):
    """Worker 1 starts outside a pool of one and makes three pushpulls back to back (raw
    calls whose gradients do not read the weights): each push is applied, each reply waits.
    When worker 0's push grows the pool to two, every one of worker 1's replies goes; only
    the oldest went, and the job hung at worker 1's next read of its weights."""
    install(monkeypatch)
    params = {"pool": "progressive", "pool_start": 1, "pool_min": 1, "pool_every": 1,
              "batch_size": 4, "epoch_samples": 16}
    s = make_server("dist_pool", params, 2, True, [6], [np.float32],
                    lambda: mx.optimizer.SGD(learning_rate=1.0))

    def pushpull(seq, worker):
        s.op_push(b"x", {"op": "pushpull", "seq": seq, "worker": worker,
                         "items": [[0, 0, "<f4", 6]]}, buffers_of([np.ones(6, np.float32)]))
        s.send_value_replies()

    for seq in (1, 2, 3):
        pushpull(seq, 1)
    assert sorted(s.sent) == []                  # outside the pool: applied, not answered
    pushpull(4, 0)                               # the 4th push of 4 samples: an epoch, 2 workers
    assert s.slots[(0, 0)].group.policy.pool.size == 2
    assert sorted(s.sent) == [1, 2, 3, 4]
    assert all(s.sent[q][1] for q in (1, 2, 3, 4))
    assert s.metrics.pushes_applied == 4

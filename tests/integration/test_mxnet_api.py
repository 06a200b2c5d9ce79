"""The KVStore API as MXNet's own distributed tests use it: dist_bsp against MXNet's dist_sync,
dist_asp against dist_async, in the same run.

One job per store runs ``tests/jobs/mxnet_api_checks.py`` (2 servers; 2 workers for the
synchronous pair, 1 for the asynchronous one, whose values then do not depend on timing): keys of
float32 and float16, small and split over the servers, initialised and read back; push then
pull under MXNet's 'test' optimizer with multi-precision; list calls, per-device value lists,
broadcast into several and nested outs, pushpull in place (the forms of MXNet's custom-store
tests); gluon.Trainer's step and its update_on_kvstore choices.  Every value must equal
what MXNet's own store gave in the same run.  Then what kvstore_ext refuses by design
(row_sparse storage, row_sparse_pull, gradient compression) must be refused at the call with
an error naming the feature, the key or parameter, and the store, and the store must go on
working afterwards.  Float16 keys are compared bit for bit on their own
(``tests/jobs/float16_home.py``).  ``scripts/mxnet_kvstore_tests.py`` runs MXNet's own test
files (docs/mxnet_tests.md).
"""
import itertools
import os

import pytest

from conftest import JOBS, read_json

CHECKS = os.path.join(JOBS, "mxnet_api_checks.py")


def reports(run_job, tmp_path, store, workers, *options):
    out = str(tmp_path / store)
    code, log = run_job(workers, 2, [CHECKS, store, out], *options, timeout=240)
    assert code == 0, log[-3000:]
    return [read_json(f"{out}.{rank}.json") for rank in range(workers)]


@pytest.mark.parametrize("mxnet_store,store,n", [("dist_sync", "dist_bsp", 2),
                                                 ("dist_async", "dist_asp", 1)])
def test_stores_answer_mxnet_kvstore_calls_as_mxnet_stores_do(run_job, tmp_path, mxnet_store,
                                                              store, n):
    native = reports(run_job, tmp_path, mxnet_store, n, "--backend", "mxnet")
    ours = reports(run_job, tmp_path, store, n)
    compared = ["init", "push_pull", "list_calls", "device_lists", "broadcast", "call_forms",
                "repeated_per_key", "repeated_keys", "trainer_step",
                "trainer_update_on_kvstore=None", "trainer_update_on_kvstore=True",
                "trainer_update_on_kvstore=False", "after_refusals", "device_sum_order",
                "optimizer_set_again", "norm_per_block"]
    for rank in range(n):
        for check in compared:
            assert ours[rank][check] == native[rank][check], (rank, check, ours[rank][check],
                                                              native[rank][check])
    # the values are MXNet's rule, not just equal: 'test' adds rate x the summed pushes
    rate = 2
    sums = [1 + rate * n * (n + 1) / 2 * (i + 1) for i in range(3)]
    assert [v[2] for v in ours[0]["push_pull"]] == [[s, s] for s in sums] * 4
    assert ours[0]["trainer_step"] == [1 - (1 + n) * n / 2] * 2
    # a failed check would have been recorded as an error string, on both sides alike
    if store == "dist_asp":    # MXNet's async rule, the same error on both
        assert ours[0]["trainer_update_on_kvstore=False"] == (
            "ValueError: Please set update_on_kvstore=True when training in async mode.")
        compared.remove("trainer_update_on_kvstore=False")
    assert not any(isinstance(ours[0][c], str) for c in compared), ours[0]

    refused = ours[0]["refused"]
    for check, words in [("init_row_sparse", ["key 901", "row_sparse"]),
                         ("push_row_sparse", ["key 3", "row_sparse", "pushed value"]),
                         ("pull_into_row_sparse", ["key 3", "row_sparse", "out array"]),
                         ("row_sparse_pull", ["row_sparse_pull", "key 3"]),
                         ("set_gradient_compression", ["gradient compression", "2bit"]),
                         ("trainer_row_sparse_weight", ["'emb'", "row_sparse weight"]),
                         ("trainer_row_sparse_gradient", ["'w'", "row_sparse gradient"]),
                         ("trainer_compression", ["gradient compression"])]:
        message = refused[check]
        assert message.startswith(("KVStoreError: ", "ValueError: ")), (check, message)
        for word in words + [store]:
            assert word in message, (check, word, message)
    # where MXNet's server aborts the whole job, ours names the key on the worker
    assert ours[0]["pull_unknown_key"].startswith("KVStoreError: key 777 has not been initialised")
    assert ours[0]["push_wrong_shape"] == ("KVStoreError: key 3: pushed shape (3, 3), but the key "
                                           "was initialised with shape (2, 3)")
    assert ours[0]["init_repeated_key"] == f"KVStoreError: {store}: key 720 is named twice in " \
                                           f"one init call"


FLOAT16 = os.path.join(JOBS, "float16_home.py")
#: keys of 20,000 elements or more are split over the servers, on both sides (a smaller job):
#: MXNet's own variable, which kvstore_ext's stores take too
SPLIT_SMALL = ["--env", "MXNET_KVSTORE_BIGARRAY_BOUND:20000"]


@pytest.mark.parametrize("mxnet_store,stores,n", [("dist_sync", ["dist_bsp", "dist_psp"], 2),
                                                  ("dist_async", ["dist_asp"], 1)])
def test_float16_keys_are_summed_and_updated_in_float32_as_on_mxnet_stores(
        run_job, tmp_path, mxnet_store, stores, n):
    """The same float16 weights, bit for bit, as MXNet's store in the same run when it sums
    and updates them in float32 (``multi_precision=True``, the one setting whose behaviour
    MXNet defines): gradients of 40,000 from two workers (their sum is past float16's largest
    value), and SGD with momentum whose steps are often below half a float16 step of the
    weights.  Ours keeps float32 whether or not the optimizer asks for it."""
    def reports(store, *options, script_options=()):
        out = str(tmp_path / f"{store}{''.join(script_options)}")
        code, log = run_job(n, 2, [FLOAT16, store, out, *script_options], *options,
                            *SPLIT_SMALL, timeout=120)
        assert code == 0, log[-3000:]
        return [read_json(f"{out}.{rank}.json") for rank in range(n)]

    native = reports(mxnet_store, "--backend", "mxnet", script_options=["--multi-precision"])
    # MXNet's weights are finite: -lr * (sum of the gradients) * rescale_grad = -0.05 * 40,000
    assert native[0]["overflow_value"] == -2000.0
    assert native[0]["overflow"][1][1] == 0   # no value of the split key is inf or NaN
    assert native[0]["moved"] > 0
    for store, script_options in itertools.product(stores, ([], ["--multi-precision"])):
        ours = reports(store, script_options=script_options)
        for rank in range(n):
            for check in ["overflow", "overflow_value", "sgd_momentum", "moved"]:
                assert ours[rank][check] == native[rank][check], \
                    (store, script_options, rank, check)

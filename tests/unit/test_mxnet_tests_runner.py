"""scripts/mxnet_kvstore_tests.py: what it changes in MXNet's tests, and a checkout it refuses."""
import importlib.util
import os
import subprocess
import sys

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "mxnet_kvstore_tests.py")
spec = importlib.util.spec_from_file_location("mxnet_kvstore_tests", SCRIPT)
runner = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runner)

TEST = """import mxnet as mx
import numpy as np
kv = mx.kv.create('dist_sync')
x = mx.nd.ones((2,), ctx=mx.gpu(1))
"""


def test_only_the_store_name_changes():
    """No ``import kvstore_ext`` either: launch.py's workers register the stores with mxnet."""
    ours = runner.adapted(TEST, "dist_sync", "dist_bsp", cpu_only=False)
    assert ours == TEST.replace("mx.kv.create('dist_sync')", "mx.kv.create('dist_bsp')")
    # MXNet's own run reads the file unchanged; GPU contexts become CPU ones for both
    assert runner.adapted(TEST, "dist_sync", None, cpu_only=False) == TEST
    assert "mx.cpu(1)" in runner.adapted(TEST, "dist_sync", None, cpu_only=True)
    assert "mx.gpu(" not in runner.adapted(TEST, "dist_sync", "dist_bsp", cpu_only=True)


def test_every_case_pairs_an_mxnet_store_with_ours():
    for file, _args, native, ours in runner.CASES:
        assert native in ("dist_sync", "dist_async", "dist_device_sync"), file
        assert ours == ("dist_asp" if native == "dist_async" else "dist_bsp"), file


def test_a_folder_without_mxnet_tests_is_refused_by_name(tmp_path):
    r = subprocess.run([sys.executable, SCRIPT, "--mxnet-src", str(tmp_path)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert r.returncode != 0 and "no tests/nightly/dist_sync_kvstore.py" in r.stdout

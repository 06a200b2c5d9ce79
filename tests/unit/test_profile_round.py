"""scripts/profile_round.py: a py-spy sample goes to the first category any frame of its stack
names, so an optimizer's MXNet call is the optimizer's and a seal's JSON is authentication."""
import importlib.util
import os

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "profile_round.py")
spec = importlib.util.spec_from_file_location("profile_round", SCRIPT)
profile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile)

RUN = "main (kvstore_ext/ps/server.py:1054);Server.run (kvstore_ext/ps/server.py:438)"
OPTIMIZER = (RUN + ";ServerOptimizer._launch (kvstore_ext/optimizers.py:300);sgd_mom_update "
             "(<string>:90);_imperative_invoke (mxnet/_ctypes/ndarray.py:65)")
SEAL_JSON = (RUN + ";Codec.seal (kvstore_ext/ps/transport.py:220);Codec._tag "
             "(kvstore_ext/ps/transport.py:199);JSONEncoder.encode (json/encoder.py:200)")
SEND = RUN + ";Server.send_to (kvstore_ext/ps/server.py:320);Socket.send (zmq/sugar/socket.py:698)"
ENGINE = ("worker (bench_kvstore.py:70);_push_async (mxnet/engine.py:10);"
          "_imperative_invoke (mxnet/_ctypes/ndarray.py:65)")


def test_a_sample_is_its_stacks_first_named_category():
    assert profile.category(OPTIMIZER.split(";")) == "optimizer (the servers' SGD)"
    assert profile.category(SEAL_JSON.split(";")) == "authentication (message tags)"
    assert profile.category(SEND.split(";")) == "ZeroMQ send and receive"
    assert profile.category(ENGINE.split(";")) == "MXNet engine operations (ctypes)"
    assert profile.category(RUN.split(";")) == profile.OTHER


def test_shares_add_up_over_a_raw_file(tmp_path):
    raw = tmp_path / "server.raw"
    raw.write_text(f"{OPTIMIZER} 6\n{SEND} 3\n{RUN} 1\nnot a sample line\n")
    out = profile.shares(str(raw))
    assert out["samples"] == 10
    assert out["shares"]["optimizer (the servers' SGD)"] == 0.6
    assert out["shares"]["ZeroMQ send and receive"] == 0.3
    assert out["shares"][profile.OTHER] == 0.1
    assert abs(sum(out["shares"].values()) - 1.0) < 1e-12

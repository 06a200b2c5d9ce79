"""A server's init: workers that disagree on a key's shape are told so, whichever comes first.

Worker 0 brings the values; the others only declare the key.  When a declaration came first
(on an asynchronous store nothing orders them), the server took it unchecked and the
disagreement surfaced later, at a pull, as a count of elements."""
import types

import numpy as np
import pytest

from kvstore_ext.ps import server as S
from server_harness import install, make_server


def _init(s, worker, shape, seq, value=None):
    size = int(np.prod(shape))
    header = {"items": [[0, 0, "<f4", list(shape), size]], "worker": worker, "seq": seq,
              "has_value": value is not None}
    buffers = [memoryview(np.full(size, value, np.float32).tobytes())] if value is not None else []
    s.op_init(b"ident", header, buffers)


@pytest.mark.parametrize("store", ["dist_asp", "dist_bsp"])
def test_a_declaration_first_binds_worker_0s_values(monkeypatch, store):
    install(monkeypatch)
    s = make_server(store, {}, 2, True, [], [])
    s.env = types.SimpleNamespace(start_timeout=60.0)
    _init(s, 1, (10,), seq=1)
    with pytest.raises(S.RequestError, match=r"key 0 is already initialised by worker 1 with "
                                             r"shape \(10,\) float32; cannot initialise it "
                                             r"again with shape \(16,\) float32"):
        _init(s, 0, (16,), seq=2, value=1.0)
    assert (0, 0) not in s.slots
    _init(s, 0, (10,), seq=3, value=1.0)            # agreeing, the key is made
    assert s.slots[(0, 0)].shape == (10,)
    assert sorted(s.sent) == [1, 3]                  # both inits answered once all came


def test_values_first_bind_a_later_declaration(monkeypatch):
    install(monkeypatch)
    s = make_server("dist_asp", {}, 2, True, [], [])
    s.env = types.SimpleNamespace(start_timeout=60.0)
    _init(s, 0, (16,), seq=1, value=1.0)
    with pytest.raises(S.RequestError, match=r"key 0 is already initialised with shape "
                                             r"\(16,\) float32; cannot initialise it again "
                                             r"with shape \(4, 4\) float32"):
        _init(s, 1, (4, 4), seq=2)

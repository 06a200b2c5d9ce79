"""What every kvstore_ext store refuses by design (kvstore_ext.keys), driven directly."""
import mxnet as mx
import pytest

from kvstore_ext.errors import KVStoreError
from kvstore_ext.keys import MXNetCalls, refuse_sparse


def test_dense_arrays_and_lists_of_them_pass():
    refuse_sparse("dist_bsp", 3, mx.nd.ones((2, 2)))
    refuse_sparse("dist_bsp", 3, [mx.nd.ones((2, 2)), mx.nd.zeros((2, 2))])


@pytest.mark.parametrize("stype", ["row_sparse", "csr"])
def test_a_sparse_array_is_refused_naming_store_key_and_storage(stype):
    arrays = [mx.nd.ones((2, 2)), mx.nd.ones((2, 2)).tostype(stype)]
    with pytest.raises(KVStoreError) as e:
        refuse_sparse("dist_asp", "w0", arrays, "pushed value")
    message = str(e.value)
    assert isinstance(e.value, mx.base.MXNetError)      # as MXNet's own stores raise
    for word in ("dist_asp", "key 'w0'", "pushed value", stype):
        assert word in message, (word, message)


class Store(MXNetCalls):
    type = "dist_ssp"


def test_row_sparse_pull_and_compression_are_refused_by_name():
    with pytest.raises(KVStoreError, match=r"dist_ssp: row_sparse_pull \(key 5\) is not supported"):
        Store().row_sparse_pull(5, out=mx.nd.zeros((2, 2)).tostype("row_sparse"),
                                row_ids=mx.nd.array([0]))
    with pytest.raises(KVStoreError, match=r"dist_ssp: gradient compression .*'2bit'"):
        Store().set_gradient_compression({"type": "2bit", "threshold": 0.5})

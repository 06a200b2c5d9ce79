"""The parameter-server runtime on ZeroMQ.

:mod:`.protocol` (the message schema), :mod:`.transport` (sealing, limits, sockets),
:mod:`.partition` (keys to servers), :mod:`.scheduler` (membership, barriers, liveness),
:mod:`.server` (keys, rounds through the registry's policies, the optimizer) with
:mod:`.server_psp` (``dist_psp``'s request handler), :mod:`.faults` and :mod:`.heap` (its
malloc thresholds), and on the worker
:mod:`.link` (one connection per process), :mod:`.batching` and :mod:`.store` (the
``KVStoreBase`` classes).
"""

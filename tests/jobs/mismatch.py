"""Workers of one job that disagree on the store: rank 0 uses argv[1], the others argv[2]."""
import os
import sys


import kvstore_ext

rank = int(os.environ["KVX_WORKER_RANK"])
name, params = (sys.argv[1], {}) if rank == 0 else (sys.argv[2], {})
if ":" in name:
    name, s = name.split(":")
    params = {"staleness": int(s)}
try:
    kv = kvstore_ext.create(name, **params)
except kvstore_ext.KVStoreError as exc:
    print(f"worker {rank} error: {exc}", flush=True)
    sys.exit(3)
print(f"worker {rank} started with {kv.type}", flush=True)
sys.exit(0)

"""The servers' malloc thresholds: freed message buffers stay in the heap instead of being
handed back and faulted in again each round (what cost a server 0.4 ms a round in one of its
two modes).  Each case runs in a fresh interpreter: the thresholds are per process."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# a server's round in miniature: three 1 MB buffers received (written), then freed; the
# page faults of 50 rounds after the first are counted
ROUNDS = """
import resource, sys
import numpy as np
from kvstore_ext.ps.heap import keep_freed_buffers
kept = keep_freed_buffers() if sys.argv[1] == "keep" else False
def round_():
    buffers = [np.ones(1 << 18, dtype=np.float32) for _ in range(3)]
    del buffers
round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    round_()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, **env) -> tuple[bool, int]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    environ.update(env, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", ROUNDS, mode], env=environ, check=True,
                         capture_output=True, text=True, timeout=60).stdout.split()
    return out[0] == "True", int(out[1])


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")


def test_kept_buffers_are_not_faulted_in_again():
    kept, faults = _faults("keep")
    left, default_faults = _faults("leave")
    assert kept and not left
    # 50 rounds of 3 MB: glibc's defaults trim and fault in ~768 pages a round
    assert default_faults > 50 * 256, default_faults
    assert faults < default_faults / 20, (faults, default_faults)


def test_users_settings_and_opt_out_rule():
    kept, _ = _faults("keep", MALLOC_TRIM_THRESHOLD_="131072")
    assert not kept
    kept, faults = _faults("keep", KVX_SERVER_MALLOC="default")
    assert not kept and faults > 50 * 256

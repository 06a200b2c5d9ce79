"""Workers that join a running job: ``launch.py --job-file`` on the job, ``launch.py --join``
for the newcomers (tests/jobs/join.py)."""
import glob
import json
import os
import stat
import time

import numpy as np
import pytest

from conftest import JOBS, launch_argv

SCRIPT = os.path.join(JOBS, "join.py")


def wait_for(path, job, seconds=120):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        assert job.proc.poll() is None, f"the job ended early:\n{job.proc.communicate()[0][-3000:]}"
        assert time.monotonic() < deadline, f"no {path} after {seconds} s"
        time.sleep(0.05)


@pytest.mark.parametrize("kvstore,params", [("dist_asp", []),
                                            ("dist_ssp", ["--kv-param", "staleness=1"])])
def test_a_joining_worker_gets_a_fresh_rank_the_current_weights_and_its_pushes_count(
        jobs, tmp_path, kvstore, params):
    job_file, metrics = str(tmp_path / "job.json"), str(tmp_path / "metrics")
    job = jobs(launch_argv(2, 1, [SCRIPT, "--dir", str(tmp_path), "--kvstore", kvstore],
                           "--job-file", job_file, "--metrics-dir", metrics, *params))
    wait_for(str(tmp_path / "ready"), job)
    assert stat.S_IMODE(os.stat(job_file).st_mode) == 0o600     # it holds the job's secret
    joiner = jobs(launch_argv(1, 1, [SCRIPT, "--dir", str(tmp_path), "--kvstore", kvstore,
                                     "--joiner"], "--join", job_file))
    assert joiner.wait(120) == 0, joiner.output[-3000:]
    assert job.wait(120) == 0, job.output[-3000:]
    assert not os.path.exists(job_file)                           # removed with the job
    # its first pull brought the server's weights, bitwise, after 50 updates
    before = np.load(tmp_path / "before_join.npz")
    pulled = np.load(tmp_path / "joiner_pulled.npz")
    for k in before.files:
        assert np.array_equal(before[k], pulled[k]), k
    pushes = [json.loads(open(p).read()) for p in glob.glob(str(tmp_path / "pushes-*.json"))]
    assert sorted(p["rank"] for p in pushes) == [0, 1, 2]           # a fresh rank
    # every push applied once: the weights moved by all of them, the joiner's included
    final = np.load(tmp_path / "final.npz")
    total = sum(p["pushes"] * (p["rank"] + 1) / 16.0 for p in pushes)
    for k in final.files:
        shape = final[k].shape
        init = np.linspace(-1, 1, int(np.prod(shape))).reshape(shape)
        np.testing.assert_allclose(final[k], init - 0.5 * total, rtol=1e-6, atol=1e-6)
    server = json.load(open(os.path.join(metrics, "server-0.json")))
    assert server["pushes_applied"] == server["blocks"] * (35 + 35 + 10)


def test_a_synchronous_job_refuses_a_joining_worker_by_name(jobs, tmp_path):
    job_file = str(tmp_path / "job.json")
    job = jobs(launch_argv(2, 1, [SCRIPT, "--dir", str(tmp_path), "--kvstore", "dist_bsp"],
                           "--job-file", job_file))
    wait_for(str(tmp_path / "ready"), job)
    joiner = jobs(launch_argv(1, 1, [SCRIPT, "--dir", str(tmp_path), "--kvstore", "dist_bsp",
                                     "--joiner"], "--join", job_file))
    assert joiner.wait(120) != 0
    assert "dist_bsp() does not take workers into a running job" in joiner.output, \
        joiner.output[-3000:]
    for marker in ("pulled", "joined"):              # let the job finish without it
        open(tmp_path / marker, "w").close()
    assert job.wait(120) == 0, job.output[-3000:]

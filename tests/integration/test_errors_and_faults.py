"""Bad input, forged messages and dead workers, with real processes."""
import os
import re
import secrets
import signal
import subprocess
import sys
import time

import pytest

from conftest import JOBS, LAUNCH, ROOT, ManualJob, job_processes_left, read_json, tagged, wait_until


def test_bad_input_raises_clear_errors_and_the_server_keeps_serving(run_job, tmp_path):
    out = str(tmp_path / "report")
    code, log = run_job(2, 1, [os.path.join(JOBS, "bad_inputs.py"), out])
    assert code == 0, log[-4000:]
    r0, r1 = read_json(out + ".0.json"), read_json(out + ".1.json")
    for what in ("uninitialised", "shape", "dtype", "reinit", "bad_key", "ignore_sparse",
                 "mixed_keys", "unknown_type",
                 "bad_staleness", "server_shape"):
        assert r0[what], what
    # both workers took part in the same 5 synchronous rounds afterwards: 0 - 5 * 0.1 * 2
    assert r0["weights"] == r1["weights"]
    assert abs(r0["weights"][0][0] + 1.0) < 1e-6
    # the forged messages got no answer, were counted, and nothing was unpickled
    assert not r0["forged_answered"] and not r0["unpickled"]
    assert not os.path.exists(out + ".unpickled")
    assert r1["rejected"] >= 3


@pytest.mark.parametrize("kvstore", ["dist_bsp", "dist_ssgd"])
def test_a_metrics_folder_that_cannot_be_written_stops_the_job_before_training(jobs, tmp_path,
                                                                               kvstore):
    """``--metrics-dir`` with a typo used to fail when the metrics were written, after the
    training (and before ``--save-params`` saved the model): now every node refuses it at once."""
    params = tmp_path / "model-{rank}.params"
    launcher = ["--launcher", "horovod"] if kvstore == "dist_ssgd" else ["-s", "1"]
    t0 = time.monotonic()
    job = jobs([sys.executable, LAUNCH, "-n", "2", *launcher, "--metrics-dir",
                "/proc/no-such-folder", sys.executable,
                os.path.join(ROOT, "scripts", "train_mnist.py"), "--kvstore", kvstore,
                "--epochs", "50", "--save-params", str(params)])
    code, log = job.wait(180), job.output
    assert code != 0, log[-3000:]
    assert "KVX_METRICS_DIR ('/proc/no-such-folder'; launch.py --metrics-dir): cannot make the " \
           "folder: No such file or directory" in log, log[-3000:]
    assert "test accuracy" not in log and not list(tmp_path.glob("model-*")), log[-3000:]
    assert time.monotonic() - t0 < 60, log[-3000:]     # 50 epochs would take minutes


@pytest.mark.parametrize("a,b,fragments", [
    ("dist_bsp", "dist_asp", ["dist_bsp()", "dist_asp()"]),
    ("dist_ssp:2", "dist_ssp:3", ["staleness=2", "staleness=3"]),
])
def test_workers_disagreeing_on_the_store_all_get_an_error_naming_both(run_job, a, b, fragments):
    code, log = run_job(2, 1, [os.path.join(JOBS, "mismatch.py"), a, b], timeout=60)
    assert code != 0
    # the two workers print at the same moment: their lines may run together
    messages = re.findall(r"worker \d error: workers disagree on the kvstore: [^\n]*?\)"
                          r"(?: but worker \d uses [^\n]*?\))", log)
    assert len(messages) == 2, log[-3000:]
    for message in messages:
        for f in fragments:
            assert f in message, message


@pytest.mark.parametrize("store", ["dist_bsp", "dist_asp", "dist_psp"])
def test_an_optimizer_failing_on_the_servers_reaches_every_worker(run_job, store):
    """MXNet's own DCASGD with momentum fails at its first update on the servers.  Before,
    only the worker whose push set the update off was told: the other one waited for the
    round for ever.  (MXNet's dist_sync swallows the error and never updates the weights.)"""
    code, log = run_job(2, 2, [os.path.join(JOBS, "broken_dcasgd.py"), store], timeout=90)
    assert code == 0, log[-4000:]
    records = sorted(tagged(log, "FAILED"), key=lambda r: r["rank"])
    assert [r["rank"] for r in records] == [0, 1], log[-4000:]
    for r in records:
        assert r["is_kvstore_error"] and r["steps"] <= 1, r
        for fragment in ("DCASGD optimizer failed", "ValueError", "truth value", "key(s)",
                         "the job stops"):
            assert fragment in r["error"], (fragment, r)
        assert r["seconds"] < 30, r


def test_dead_worker_stops_the_job_with_its_name(tmp_path):
    job = ManualJob(tmp_path, 2, "fail", ["dist_bsp", "200"])
    try:
        t0 = time.monotonic()
        code = job.workers[0].wait(timeout=30)
        elapsed = time.monotonic() - t0
        assert code == 4, job.output(0)
        out = job.output(0)
        # the killed process's connection closes at once: no heartbeat timeout to wait for
        assert "worker 1 died" in out and "connection to the scheduler closed" in out, out
        assert float(re.search(r"stopped at [\d.]+ after ([\d.]+) s", out).group(1)) < 3, out
        assert job.workers[1].wait(timeout=5) == -signal.SIGKILL
        # the scheduler and the server shut down by themselves
        assert all(p.wait(timeout=20) is not None for p in job.procs)
        assert elapsed < 25
    finally:
        job.kill()


def test_a_worker_whose_script_raises_stops_the_job_with_the_exception(tmp_path):
    """Worker 1's script raises at round 3, without a launcher to stop the job.  Before, its
    exit said "finished" to the scheduler, and worker 0 trained on alone, told nothing."""
    job = ManualJob(tmp_path, 2, "fail", ["dist_asp", "100000", "3", "raise"])
    try:
        assert job.workers[1].wait(timeout=60) == 1, job.output(1)
        assert "RuntimeError: a bug in the script at round 3" in job.output(1)
        assert job.workers[0].wait(timeout=20) == 4, job.output(0)
        out = job.output(0)
        assert re.search(r"WorkerLostError: worker 1 died \(it stopped because its script "
                         r"raised RuntimeError: a bug in the script at round 3\)", out), out
        assert float(re.search(r"stopped at [\d.]+ after ([\d.]+) s", out).group(1)) < 30, out
    finally:
        job.kill()


def test_a_worker_or_server_with_another_jobs_secret_is_told_so_at_once(tmp_path):
    """Worker 1, and a second server, have another job's ``KVX_SECRET``: the scheduler refuses
    their connections at the handshake.  Before, the worker's messages were dropped unread and
    it waited out the start timeout (600 s by default), then said the job did not start; the
    server waited that long and said the same."""
    other = secrets.token_hex(32)
    job = ManualJob(tmp_path, 2, "fail", ["dist_bsp", "20"], worker_env={1: {"KVX_SECRET": other}})
    stranger = job.start([sys.executable, "-m", "kvstore_ext.ps.server"],
                         dict(job.env, KVX_SECRET=other), "server", stdout=subprocess.PIPE)
    try:
        t0 = time.monotonic()
        assert job.workers[1].wait(timeout=60) == 1, job.output(1)
        assert time.monotonic() - t0 < 30
        out = job.output(1)
        refused = (r"the scheduler at tcp://127\.0\.0\.1:\d+ refused this process's connection "
                   r"at the handshake: it belongs to another job, or this process's KVX_SECRET "
                   r"\(or KVX_CURVE\) is not the job's")
        assert re.search(r"KVStoreError: " + refused, out), out
        assert stranger.wait(timeout=60) == 1
        assert time.monotonic() - t0 < 30
        out = stranger.stdout.read().decode()
        assert re.search(r"kvstore_ext server: " + refused, out), out
    finally:
        job.kill()


def test_a_frozen_scheduler_is_named_by_every_worker_not_the_server_that_stopped(tmp_path):
    """The scheduler is frozen (SIGSTOP) while 2 workers train.  The server's connection to it
    times out first (its heartbeat timeout is 1 s, the workers' 4 s), and it stops.  Before,
    it exited at once, and each worker whose own connection had not yet timed out blamed the
    server (ServerLostError: server 0 closed its connection; 3 of 8 with equal timeouts)."""
    slow = {"KVX_HEARTBEAT_TIMEOUT": "4"}
    job = ManualJob(tmp_path, 2, "fail", ["dist_asp", "1000000", "-1"], heartbeat_timeout=1.0,
                    worker_env={0: slow, 1: slow})
    try:
        assert wait_until(lambda: all(f"worker {r} started" in job.output(r) for r in (0, 1)),
                          60)
        time.sleep(1.0)
        os.kill(job.scheduler.pid, signal.SIGSTOP)
        for rank in (0, 1):
            assert job.workers[rank].wait(timeout=60) == 4, job.output(rank)
            out = job.output(rank)
            assert re.search(r"SchedulerLostError: the scheduler at tcp://127\.0\.0\.1:\d+ "
                             r"(is gone|closed its connection)", out), out
        assert job.servers[0].wait(timeout=30) == 1
    finally:
        os.kill(job.scheduler.pid, signal.SIGCONT)
        job.kill()


def test_a_scheduler_frozen_before_the_start_is_named_at_the_heartbeat_timeout(tmp_path):
    """Worker 0 has registered; the job waits for worker 1 (refused: another job's secret)
    when the scheduler freezes.  Before, worker 0 waited out the start timeout (600 s by
    default) and then said the job did not start; now its connection's heartbeats say it."""
    job = ManualJob(tmp_path, 2, "fail", ["dist_bsp", "20"],
                    worker_env={1: {"KVX_SECRET": secrets.token_hex(32)}})
    try:
        assert job.workers[1].wait(timeout=60) == 1, job.output(1)
        time.sleep(1.0)
        os.kill(job.scheduler.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        assert job.workers[0].wait(timeout=60) == 1, job.output(0)
        assert time.monotonic() - t0 < 20
        out = job.output(0)
        assert re.search(r"SchedulerLostError: the scheduler at tcp://127\.0\.0\.1:\d+ closed its "
                         r"connection: it exited or was killed, or its host stopped answering for "
                         r"2 s before the job started", out), out
    finally:
        os.kill(job.scheduler.pid, signal.SIGCONT)
        job.kill()


def test_a_worker_dying_while_the_others_wait_at_a_barrier_stops_them_there(tmp_path):
    """Worker 1 is killed while worker 0 waits at ``kv.barrier()``.  Before, the scheduler,
    seeing every live worker at the barrier, let it go with OK: the barrier returned as if
    nothing had happened, and the death surfaced only at exit."""
    job = ManualJob(tmp_path, 2, "fail", ["dist_bsp", "20", "-1", "barrier"])
    try:
        assert job.workers[0].wait(timeout=60) == 4, job.output(0)
        out = job.output(0)
        assert re.search(r"WorkerLostError: worker 1 died \(its connection to the scheduler "
                         r"closed", out), out
        assert "finished" not in out, out
    finally:
        job.kill()


def test_an_operation_failing_after_the_caught_stop_keeps_the_exit_code(tmp_path):
    """A write-back that MXNet's engine starts only after the script caught the job's stop
    fails with that stop: it was reported, so the process exits with the script's code, not 1
    with "no later call reported it" (seen when the last rounds' write-backs failed after the
    first had been raised)."""
    job = ManualJob(tmp_path, 2, "fail", ["dist_bsp"], script="fails_after_stop.py")
    try:
        code = job.workers[0].wait(timeout=30)
        out = job.output(0)
        assert "worker 0 caught WorkerLostError: worker 1 died" in out, out
        assert "let the held write-back fail" in out, out
        assert "no later call reported it" not in out, out
        assert code == 4, out
    finally:
        job.kill()


def test_a_stop_only_an_engine_operation_met_still_exits_non_zero(tmp_path):
    """The other side of the test above: the stop failed a write-back in the engine and no
    later call raised it, so the caller never saw it: exit 1, naming it."""
    job = ManualJob(tmp_path, 2, "fail", ["dist_bsp"], script="stop_never_seen.py")
    try:
        code = job.workers[0].wait(timeout=30)
        out = job.output(0)
        assert "no later call reported it: worker 1 died" in out, out
        assert code == 1, out
    finally:
        job.kill()


def test_dead_worker_can_be_left_behind_when_elastic(tmp_path):
    job = ManualJob(tmp_path, 2, "continue", ["dist_bsp", "60"])
    try:
        assert job.workers[0].wait(timeout=40) == 0, job.output(0)
        assert "finished 60 rounds" in job.output(0)
        # 3 rounds with two workers (0.2 each), 57 alone (0.1 each)
        assert "w=-6.30" in job.output(0), job.output(0)
        assert all(p.wait(timeout=20) is not None for p in job.procs)
    finally:
        job.kill()


def test_launcher_stops_everything_when_a_worker_dies(run_job, tmp_path):
    marker = str(tmp_path)
    code, log = run_job(2, 1, [os.path.join(JOBS, "die.py"), "dist_bsp", "200", "3", marker],
                        timeout=60)
    assert code != 0
    assert "worker 1 exited with status -9" in log or "worker 1 exited with status 137" in log, log
    assert wait_until(lambda: not job_processes_left(marker), 10), job_processes_left(marker)


CRASH = """
import ctypes, sys
import mxnet as mx
import kvstore_ext
kv = mx.kv.create("dist_bsp")
kv.init(0, mx.nd.zeros((4,)))
if kv.rank == 1:
    ctypes.string_at(0)         # a crash in native code: a read of address 0
kv.barrier()
"""


def test_a_worker_that_crashes_in_native_code_is_named_with_its_signal_and_stacks(run_job, tmp_path):
    """The job's message names the crash (MXNet's own handler would have ended the worker
    with status 255), the worker's Python stacks are in the output, the job's status is
    128 + SIGSEGV's, and nothing is left running."""
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    code, log = run_job(2, 1, [str(script)], timeout=90)
    assert code == 128 + signal.SIGSEGV, log[-3000:]
    assert "worker 1 exited with status -11 (killed by SIGSEGV, a crash); stopping the job" in log, \
        log[-3000:]
    assert "Fatal Python error: Segmentation fault" in log
    assert re.search(r'File "[^"]*crash\.py", line 8 in <module>', log), log[-3000:]
    assert wait_until(lambda: not job_processes_left(str(script)), 10)


def test_launcher_ctrl_c_leaves_no_process(jobs, tmp_path):
    marker = str(tmp_path)
    from conftest import launch_argv
    job = jobs(launch_argv(2, 1, [os.path.join(JOBS, "die.py"), "dist_asp", "100000", "-1", marker]))
    assert wait_until(lambda: len(job_processes_left(marker)) >= 2, 30)
    time.sleep(1.0)
    job.proc.send_signal(signal.SIGINT)
    code = job.wait(30)
    assert code == 128 + signal.SIGINT, job.output
    assert wait_until(lambda: not job_processes_left(marker), 10), job_processes_left(marker)


#: what a worker of a job sees: its role, and whether the errors are MXNet's
ROLE_PROBE = ("import os, mxnet, kvstore_ext; "
              "print('probe:', os.environ.get('KVX_ROLE'), "
              "issubclass(kvstore_ext.KVStoreError, mxnet.base.MXNetError), flush=True)")


@pytest.mark.parametrize("options,role", [(["-s", "1", "--launcher", "local"], "worker"),
                                          (["--launcher", "horovod"], "None")])
def test_the_launcher_loads_no_mxnet_and_no_node_takes_its_role(jobs, options, role):
    """The launcher only starts processes: loading mxnet cost every job about 2 s before any
    node started.  A worker must still come up in its own role, registering the stores with
    MXNet's error classes (the jobs' environments drop identity variables, so this holds even
    if the launcher kept its role; that main() drops it is test_launcher's unit test)."""
    from conftest import LAUNCH
    job = jobs([sys.executable, "-X", "importtime", LAUNCH, "-n", "1", *options,
                sys.executable, "-c", ROLE_PROBE])
    code = job.wait(120)
    assert code == 0, job.output[-4000:]
    launcher_imports = [l for l in job.output.splitlines() if l.startswith("import time:")]
    assert any("kvstore_ext.launch" in l for l in launcher_imports), job.output[-4000:]
    assert not [l for l in launcher_imports if "mxnet" in l]
    assert f"probe: {role} True" in job.output, job.output[-4000:]


def test_a_value_that_is_not_an_ndarray_is_refused_on_every_worker_at_once(run_job):
    """``kv.init(30, numpy_array)`` on every worker: each is told at once which key and what
    it got (an AssertionError, as from MXNet's stores, and a TypeError), and the store goes on
    working.  Before, worker 0 alone failed and worker 1 waited out the start timeout."""
    code, log = run_job(2, 1, [os.path.join(JOBS, "init_numpy.py"), "dist_bsp"],
                        "--start-timeout", "20", timeout=60)
    assert code == 0, log[-3000:]
    for rank in (0, 1):
        assert re.search(rf"worker {rank}: NotAnNDArray: key 30: the value must be an mxnet "
                         rf"NDArray \(or a list of them, one per device\), got ndarray "
                         rf"\((\d+\.\d) s\)", log), log[-3000:]
        assert f"worker {rank}: NotAnNDArray: key 32: the value must be an mxnet" in log
        assert f"worker {rank}: pull: key 30: the out must be an mxnet NDArray" in log
        assert f"worker {rank}: value 2.0" in log   # SGD-less store: the sum of the pushes
    waits = [float(t) for t in re.findall(r"got ndarray \((\d+\.\d) s\)", log)]
    assert max(waits) < 5, waits


def test_an_optimizer_defined_in_the_script_is_refused_with_what_to_do(run_job):
    code, log = run_job(2, 1, [os.path.join(JOBS, "script_optimizer.py"), "dist_bsp"],
                        timeout=60)
    assert code != 0
    assert "trained" not in log
    assert re.search(r"KVStoreError: the optimizer cannot be loaded on the servers "
                     r"\(AttributeError: Can't get attribute 'HalfSGD'.*launch\.py --plugin "
                     r"MODULE", log), log[-3000:]


def test_the_launcher_names_a_frozen_worker_not_the_one_that_exited(run_job):
    """A frozen worker never exits; the first process to exit is worker 0, which lost it.
    The launcher's last lines said only 'worker 0 exited with status 1'; now they also give
    the scheduler's reason, which names worker 1."""
    code, log = run_job(2, 1, [os.path.join(JOBS, "freeze_self.py")],
                        "--heartbeat-timeout", "2", timeout=60)
    assert code == 1, log[-3000:]
    assert "launch.py: worker 0 exited with status 1; stopping the job" in log, log[-3000:]
    assert re.search(r"launch\.py: the scheduler's reason: worker 1 died \(its connection to "
                     r"the scheduler closed", log), log[-3000:]


def test_a_worker_with_no_scheduler_to_reach_says_so_and_what_it_found(tmp_path):
    """A worker joining a job that has ended (nothing listens at the scheduler's address):
    it waited out the start timeout (600 s by default) in silence, then said the scheduler
    did not start the job.  Now it says at once that nothing answers yet, and at the end that
    no scheduler runs there."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]            # free again once closed: nothing listens there
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVX_", "DMLC_"))}
    env.update({"KVX_SCHEDULER_HOST": "127.0.0.1", "KVX_SCHEDULER_PORT": str(port),
                "KVX_NUM_WORKER": "2", "KVX_NUM_SERVER": "1", "KVX_SECRET": secrets.token_hex(32),
                "KVX_ROLE": "worker", "KVX_START_TIMEOUT": "4", "PYTHONPATH": ROOT})
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "import mxnet as mx, kvstore_ext; "
                                                 "mx.kv.create('dist_bsp')"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and time.monotonic() - t0 < 30
    assert f"kvstore_ext worker: nothing answers at tcp://127.0.0.1:{port} yet; waiting up " \
           f"to 4 s" in proc.stderr, proc.stderr[-3000:]
    assert f"nothing answered at tcp://127.0.0.1:{port} in 4 s: no scheduler of this job runs " \
           f"there (the job has ended" in proc.stderr, proc.stderr[-3000:]


def test_a_worker_frozen_past_the_timeout_is_told_so_when_it_wakes(tmp_path):
    """Worker 1 is stopped (SIGSTOP) for 5 s, past the 2 s heartbeat timeout, under
    ``continue``: the others go on without it.  When it runs again it was told the server
    (or the scheduler) closed its connection, as if that peer had died; now it is told that
    it did not run for 5 s itself, and what follows from that."""
    job = ManualJob(tmp_path, 2, "continue", ["dist_asp", "3000", "-1"])
    try:
        wait_until(lambda: "worker 1 started" in job.output(1), 60)
        time.sleep(0.5)
        os.kill(job.workers[1].pid, signal.SIGSTOP)
        time.sleep(5)
        os.kill(job.workers[1].pid, signal.SIGCONT)
        assert job.workers[1].wait(timeout=60) != 0
        out = job.output(1)
        assert re.search(r"closed its connection after this process did not run for [5-9] s "
                         r"\(stopped, or starved of CPU\), longer than the 2 s heartbeat timeout",
                         out), out[-3000:]
    finally:
        job.kill()

"""launch.py's command line: help, dry runs for every launcher, argument errors, the
environments it gives the nodes."""
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import LAUNCH, ROOT
from kvstore_ext import jobenv
from kvstore_ext.launch import build_parser
from kvstore_ext.launch.ps_job import Job


def launch(*args, input=None):
    return subprocess.run([sys.executable, LAUNCH, *args], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60, input=input)


def test_help_explains_every_option():
    out = launch("--help").stdout
    for option in ("--num-workers", "--num-servers", "--hostfile", "--launcher", "--env",
                   "--env-server", "--env-worker", "--backend", "--kv-param", "--on-worker-death",
                   "--heartbeat-timeout", "--metrics-dir", "--timeout", "--dry-run"):
        assert option in out, option


def test_dry_run_local_shows_roles_and_hides_the_secret():
    out = launch("-n", "2", "-s", "1", "--dry-run", "--kv-param", "staleness=2",
                 "python", "train.py").stdout
    assert "server 0:" in out and "worker 1:" in out
    assert "KVX_WORKER_RANK=1" in out and '{"staleness": 2}' in out
    assert "KVX_SECRET=<secret>" in out


def test_dry_run_ssh_places_nodes_on_hosts_and_sends_the_secret_on_stdin(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a\nnode-b:2222\n")
    out = launch("-n", "2", "-s", "2", "-H", str(hostfile), "--scheduler-host", "10.0.0.1",
                 "--dry-run", "python", "train.py").stdout
    assert "ssh -o StrictHostKeyChecking=no -o BatchMode=yes node-a" in out
    assert "-p 2222 node-b" in out
    assert "read -r KVX_SECRET" in out
    assert "KVX_NODE_HOST=node-b" in out and "KVX_SCHEDULER_HOST=10.0.0.1" in out


def test_dry_run_mpi_and_native_backend(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a\n")
    out = launch("-n", "2", "-s", "1", "-H", str(hostfile), "--launcher", "mpi",
                 "--scheduler-host", "10.0.0.1", "--dry-run", "python", "train.py").stdout
    assert "mpirun --allow-run-as-root -n 1 -H node-a -x KVX_" in out
    out = launch("-n", "2", "-s", "1", "--backend", "mxnet", "--dry-run", "python", "t.py").stdout
    assert "DMLC_ROLE=server" in out and "DMLC_NUM_WORKER=2" in out and "import mxnet" in out


def test_bad_arguments_are_explained():
    r = launch("-n", "2", "--launcher", "ssh", "python", "t.py")
    assert r.returncode != 0 and "needs -H HOSTFILE" in r.stdout
    r = launch("-n", "2", "--kv-param", "staleness", "python", "t.py")
    assert r.returncode != 0 and "NAME=VALUE" in r.stdout
    r = launch("-n", "0", "python", "t.py")
    assert r.returncode != 0 and "-n must be at least 1" in r.stdout


def test_servers_compute_as_jobenv_says_unless_told_otherwise(monkeypatch):
    """A server runs MXNet's naive engine on one OpenMP thread (jobenv.SERVER_COMPUTE_DEFAULTS);
    a value the user gives, for the servers or in the shell, wins; workers are left alone."""
    for var in jobenv.SERVER_COMPUTE_DEFAULTS:
        monkeypatch.delenv(var, raising=False)
    def plan(*options):
        args = build_parser().parse_args(["-n", "2", "-s", "2", *options, "python", "x.py"])
        nodes = Job(args).plan(1234)
        return ([n.env for n in nodes if n.name.startswith("server")],
                [n.env for n in nodes if n.name.startswith("worker")])
    servers, workers = plan()
    assert len(servers) == 2 and all(
        env[var] == value for env in servers for var, value in jobenv.SERVER_COMPUTE_DEFAULTS.items())
    assert all(var not in env for env in workers for var in jobenv.SERVER_COMPUTE_DEFAULTS)
    servers, _ = plan("--env-server", "OMP_NUM_THREADS:4")
    assert all(env["OMP_NUM_THREADS"] == "4" and env["MXNET_ENGINE_TYPE"] == "NaiveEngine"
               for env in servers)
    monkeypatch.setenv("MXNET_ENGINE_TYPE", "ThreadedEnginePerDevice")
    servers, workers = plan()
    assert all(env["MXNET_ENGINE_TYPE"] == "ThreadedEnginePerDevice" for env in servers + workers)


def test_mxnets_bigarray_bound_reaches_every_node_unless_ours_is_given(monkeypatch):
    """A user of MXNet sets MXNET_KVSTORE_BIGARRAY_BOUND: the keys are split where MXNet's
    stores split them (it was ignored: LAMB's per-block norms gave other weights)."""
    def bounds(*options):
        args = build_parser().parse_args(["-n", "2", "-s", "2", *options, "python", "x.py"])
        return {n.env.get(jobenv.BIGARRAY_BOUND) for n in Job(args).plan(1234)
                if n.name != "scheduler"}
    monkeypatch.delenv(jobenv.BIGARRAY_BOUND, raising=False)
    monkeypatch.delenv(jobenv.MXNET_BIGARRAY_BOUND, raising=False)
    assert bounds() == {None}
    monkeypatch.setenv(jobenv.MXNET_BIGARRAY_BOUND, "100")
    assert bounds() == {"100"}
    assert bounds("--env", "KVX_BIGARRAY_BOUND:50") == {"50"}
    for name, value in [(jobenv.SCHEDULER_HOST, "h"), (jobenv.SCHEDULER_PORT, "1"),
                        (jobenv.NUM_WORKER, "1"), (jobenv.NUM_SERVER, "2"),
                        (jobenv.SECRET, "ab" * 32)]:
        monkeypatch.setenv(name, value)
    assert jobenv.JobEnv.from_environ("worker").bigarray_bound == 100   # started by hand
    monkeypatch.setenv(jobenv.BIGARRAY_BOUND, "7")
    assert jobenv.JobEnv.from_environ("worker").bigarray_bound == 7


def test_the_launchers_role_ends_with_its_import(monkeypatch, capsys):
    """A launcher imports the package in its own role (no mxnet); main() drops the role, so
    that no node it starts (horovodrun passes its whole environment on) could inherit it."""
    from kvstore_ext.launch.cli import launcher_env, main
    assert launcher_env()[jobenv.ROLE] == jobenv.LAUNCHER
    assert jobenv.LAUNCHER in jobenv.WITHOUT_MXNET
    monkeypatch.setenv(jobenv.ROLE, jobenv.LAUNCHER)
    assert main(["-n", "1", "-s", "1", "--dry-run", "python", "train.py"]) == 0
    assert jobenv.ROLE not in os.environ
    assert "worker 0:" in capsys.readouterr().out


def test_the_launch_command_loads_no_mxnet():
    """``kvstore-launch`` (and launch.py) enter through ``kvstore_ext_launch``, which must set
    the launcher's role, as jobenv spells it, before anything imports the package."""
    probe = ("import os, sys, kvstore_ext_launch; "
             "code = kvstore_ext_launch.main(['-n', '1', '-s', '1', '--dry-run', 'python', 't.py']); "
             "print('mxnet loaded:', 'mxnet' in sys.modules, 'role left:', 'KVX_ROLE' in os.environ); "
             "sys.exit(code)")
    env = {k: v for k, v in os.environ.items() if k != jobenv.ROLE}
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=60)
    assert out.returncode == 0, out.stdout
    assert "worker 0:" in out.stdout
    assert "mxnet loaded: False role left: False" in out.stdout, out.stdout


def test_workers_get_the_autoload_folder_first_on_their_pythonpath(monkeypatch):
    """Local workers (not the scheduler or servers, not --no-autoload, not ps-lite's nodes)
    get kvstore_ext.launch.autoload first on PYTHONPATH, the user's entries kept after it."""
    from kvstore_ext.launch.autoload import FOLDER
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/user/lib", FOLDER]))

    def paths(*options):
        args = build_parser().parse_args(["-n", "2", "-s", "1", *options, "python", "x.py"])
        job = Job(args)
        job.native_port = 1235          # what start_scheduler() sets for ps-lite's nodes
        return {n.name: n.env.get("PYTHONPATH") for n in job.plan(1234)}
    got = paths()
    assert got["worker 0"] == got["worker 1"] == os.pathsep.join([FOLDER, "/user/lib"])
    assert got["server 0"] == os.pathsep.join(["/user/lib", FOLDER])    # as the shell had it
    assert set(paths("--no-autoload").values()) == {os.pathsep.join(["/user/lib", FOLDER])}
    assert set(paths("--backend", "mxnet").values()) == {os.pathsep.join(["/user/lib", FOLDER])}


def test_remote_workers_get_the_autoload_folder_by_name(tmp_path, monkeypatch):
    """On ssh and mpi hosts the folder goes as KVX_AUTOLOAD (to workers only, not with
    --no-autoload), set for the guard too: over ssh `env NAME=VALUE ... python -c GUARD`."""
    from kvstore_ext.launch.autoload import FOLDER
    monkeypatch.setenv("PYTHONPATH", "/user/lib")
    hosts = tmp_path / "hosts"
    hosts.write_text("h1\nh2\n")

    def nodes(launcher, *options):
        args = build_parser().parse_args(["-n", "2", "-s", "1", "-H", str(hosts), "--launcher",
                                          launcher, *options, "python", "x.py"])
        return {n.name: n for n in Job(args).plan(1234)}
    for launcher in ("ssh", "mpi"):
        got = nodes(launcher)
        assert [n.job_env.get(jobenv.AUTOLOAD) for n in got.values()] == [None, FOLDER, FOLDER]
        assert all(n.job_env.get("PYTHONPATH") == "/user/lib" for n in got.values())
        assert not any(jobenv.AUTOLOAD in n.job_env
                       for n in nodes(launcher, "--no-autoload").values())
    remote = nodes("ssh")["worker 0"].argv[-1]
    assert "exec env " in remote and \
        remote.index(f" {jobenv.AUTOLOAD}={FOLDER} ") < remote.index(" -c "), remote
    mpirun = nodes("mpi")["worker 1"].argv
    assert mpirun[mpirun.index(jobenv.AUTOLOAD) - 1] == "-x"


GUARDED_NODE = "import os; print('PYTHONPATH=' + os.environ.get('PYTHONPATH', ''))"


@pytest.mark.parametrize("where", ["given", "found", "none"])
def test_the_guard_puts_the_autoload_folder_first_where_this_host_has_one(tmp_path, where):
    """The path the launcher sent, where it exists; else this host's kvstore_ext's own folder
    (found from the node's directory, not imported); else a word that the script needs
    ``import kvstore_ext``, and the node runs all the same."""
    from kvstore_ext.launch.autoload import FOLDER
    from kvstore_ext.launch.process import guarded
    env = {k: v for k, v in os.environ.items() if k not in (jobenv.ROLE, "PYTHONPATH")}
    env.update(PYTHONPATH="/user/lib",
               **{jobenv.AUTOLOAD: FOLDER if where == "given" else str(tmp_path / "gone")})
    cwd = ROOT if where == "found" else str(tmp_path)     # a checkout holds kvstore_ext/
    argv = guarded([sys.executable, "-c", GUARDED_NODE], watch_input=False)
    if where == "none":   # the guard without site-packages, where kvstore_ext is installed
        argv.insert(1, "-S")
    out = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=60)
    assert out.returncode == 0, out.stdout
    if where == "none":
        assert "PYTHONPATH=/user/lib\n" in out.stdout, out.stdout
        assert "add 'import kvstore_ext' to the script" in out.stdout, out.stdout
    else:
        assert f"PYTHONPATH={os.pathsep.join([FOLDER, '/user/lib'])}\n" in out.stdout, out.stdout


def _python_with_autoload(tmp_path, code, *before):
    from kvstore_ext.launch.autoload import FOLDER
    env = {k: v for k, v in os.environ.items() if k != jobenv.ROLE}
    env["PYTHONPATH"] = os.pathsep.join([*before, FOLDER, str(tmp_path)])
    return subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)


def test_autoload_registers_the_stores_when_the_script_imports_mxnet(tmp_path):
    """Nothing is imported at start-up; ``import mxnet`` brings the stores (from a checkout:
    the folder's package); a sitecustomize further along the path still runs."""
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE'] = 'ran'\n")
    out = _python_with_autoload(tmp_path, (
        "import os, sys\n"
        "print('at start:', 'kvstore_ext' in sys.modules, 'mxnet' in sys.modules, "
        "os.environ.get('OTHER_SITE'))\n"
        "import mxnet as mx\n"
        "print('after:', sorted(n for n in mx.kvstore.KVStoreBase.kv_registry "
        "if n.startswith('dist_')))\n"
        "print('from:', os.path.dirname(sys.modules['kvstore_ext'].__file__))\n"
        "print('loader:', mx.__spec__.loader.get_filename('mxnet'))\n"))
    assert out.returncode == 0, out.stdout
    assert "at start: False False ran" in out.stdout, out.stdout
    assert "'dist_bsp'" in out.stdout and "'dist_ssgd'" in out.stdout, out.stdout
    assert f"from: {os.path.join(ROOT, 'kvstore_ext')}" in out.stdout, out.stdout
    assert "mxnet/__init__.py" in out.stdout, out.stdout


def test_autoload_that_cannot_import_kvstore_ext_leaves_mxnet_working(tmp_path):
    broken = tmp_path / "broken"
    (broken / "kvstore_ext").mkdir(parents=True)
    (broken / "kvstore_ext" / "__init__.py").write_text("raise ImportError('no pyzmq here')\n")
    out = _python_with_autoload(tmp_path, "import mxnet as mx; print('sum', mx.nd.ones(3).sum().asscalar())",
                                str(broken))
    assert out.returncode == 0, out.stdout
    assert "sum 3.0" in out.stdout
    assert "kvstore_ext: its stores are not registered (ImportError: no pyzmq here)" in out.stdout


def test_the_workers_options_are_theirs_even_when_they_begin_like_ours():
    """The command after the launcher's options is the workers', verbatim: '--sched' (the
    start of --scheduler-host and --scheduler-port) stopped the launch as ambiguous, and a
    prefix of one option would have been taken for it."""
    args = build_parser().parse_args(["-n", "1", "-s", "1", "python", "t.py", "--sched", "3",
                                      "--dev", "x", "--time", "1", "--kv-param", "a=1"])
    assert args.command == ["python", "t.py", "--sched", "3", "--dev", "x", "--time", "1",
                            "--kv-param", "a=1"]
    assert args.device is None and args.timeout == 0 and args.kv_param == []


def _other_addresses() -> list[str]:
    """This machine's IPv4 addresses outside loopback (``ip -4 -o addr``)."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    return [f.split("/")[0] for line in out.splitlines() for f in line.split()[3:4]
            if not f.startswith("127.")]


def test_a_local_horovod_jobs_rendezvous_server_listens_on_loopback_only():
    """The launcher's Gloo rendezvous server answers on 127.0.0.1, where its workers look,
    and refuses the machine's other addresses (Horovod's own binds every interface)."""
    import socket
    import urllib.request
    from kvstore_ext.launch.horovod_job import loopback_rendezvous
    server = loopback_rendezvous()
    port = server.start()
    try:
        assert server._httpd.socket.getsockname() == ("127.0.0.1", port)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/scope/key", data=b"v",
                                         method="PUT")
        urllib.request.urlopen(request, timeout=2).close()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/scope/key", timeout=2) as answer:
            assert answer.read() == b"v"
        for address in _other_addresses():
            with pytest.raises(OSError):
                socket.create_connection((address, port), timeout=2).close()
    finally:
        server.stop()


def _node(name: str, code: str):
    """A real process of a job: ``python -c code``."""
    from kvstore_ext.launch.process import Node
    return Node(name, [sys.executable, "-c", code], dict(os.environ))


def test_a_server_failing_after_the_workers_finished_fails_the_job(capsys):
    """The workers end with 0; a server then fails while closing (its metrics not written):
    the job's status is the server's, and the launcher says so (it said 0 before)."""
    from kvstore_ext.launch.process import Supervisor
    sup = Supervisor(timeout=30)
    status = sup.run(lambda: [sup.spawn(_node("worker 0", "pass")),
                              sup.spawn(_node("server 0", "import time, sys; time.sleep(1.0); "
                                                          "sys.exit(3)"))])
    assert status == 3
    assert "server 0 exited with status 3 after the workers finished" in capsys.readouterr().err


def test_processes_a_worker_started_are_stopped_after_it_ended(tmp_path):
    """A worker script starts a child and ends cleanly: the child (which would hold the job's
    output open) is stopped with the job, though its parent is gone."""
    from kvstore_ext.launch.process import Supervisor
    pid_file = tmp_path / "child.pid"
    spawn_child = ("import subprocess, sys; "
                   "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
                   f"open({str(pid_file)!r}, 'w').write(str(p.pid))")
    sup = Supervisor(timeout=30)
    assert sup.run(lambda: [sup.spawn(_node("worker 0", spawn_child)),
                            sup.spawn(_node("server 0", "pass"))]) == 0
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    alive = _alive(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "the worker's child outlived the job"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, reaped by init soon, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False

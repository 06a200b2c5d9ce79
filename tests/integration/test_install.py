"""The project installs like a library: a wheel built from the checkout, and ``pip install`` of
the source tree, each into a fresh virtualenv, give ``import kvstore_ext`` and
``import gluon_trainers`` from that virtualenv's site-packages (not from the checkout), the
metadata of setup.cfg, and the console commands; a small job runs through the installed
``kvstore-launch``.

Nothing is downloaded: the wheel is built with ``--no-deps --no-build-isolation``, pip runs with
``--no-index``, and the fresh virtualenvs see the dependencies already installed for the
interpreter running the tests (mxnet, numpy, pyzmq, ...) through a ``.pth`` file naming a
folder of links to its site-packages, minus this project's own (editable) installation.
The checkout is copied first, without .git, .venv and build outputs, so that building leaves
nothing in it (no build/ or *.egg-info) and concurrent runs do not share a build folder.
"""
from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PACKAGES = ("kvstore_ext", "gluon_trainers")
#: the checkout's parts that are not sources: not copied for the build
NOT_SOURCES = (".git", ".venv", "venv", "build", "dist", "results", "*.egg-info", "__pycache__",
               ".pytest_cache", ".hypothesis", ".mypy_cache")
#: each console command and what its --help must show
COMMANDS = {
    "kvstore-launch": ["--num-workers", "--num-servers", "--launcher", "--kv-param"],
    "kvstore-reproduce": ["config", "--dry-run", "--virtual", "--trials"],
    "kvstore-plan": ["calibrate", "predict", "search", "validate"],
    "kvstore-simulate": ["--speeds", "--workers", "--train"],
}
#: a job's worker, run by the installed launcher: without set_optimizer the servers keep the
#: pushed sum as the value (as MXNet's dist_sync servers do), so both workers pull 1 + 2
WORKER = """
import mxnet as mx
import kvstore_ext
kv = mx.kv.create('dist_bsp')
assert kv.type == 'dist_bsp' and kv.num_workers == 2, (kv.type, kv.num_workers)
kv.init(3, mx.nd.ones((2, 3)))
kv.push(3, mx.nd.ones((2, 3)) * (kv.rank + 1))
out = mx.nd.zeros((2, 3))
kv.pull(3, out=out)
value = out.asnumpy()
assert value[0, 0] == 3.0 and (value == 3.0).all(), value
print('worker %d pulled %s from %s' % (kv.rank, value[0, 0], kvstore_ext.__file__), flush=True)
"""
#: what a fresh virtualenv reports about the installed project (run from outside the checkout)
PROBE = """
import importlib, importlib.metadata as md, json, sys, sysconfig
import gluon_trainers, kvstore_ext
subpackages = ['kvstore_ext.' + name for name in
               ('ps', 'policies', 'plan', 'simulate', 'launch', 'horovod')]
files = {name: importlib.import_module(name).__file__
         for name in ['kvstore_ext', 'gluon_trainers', *subpackages]}
dist = md.distribution('kvstore_ext')
print(json.dumps({
    'files': files, 'sys_path': sys.path, 'purelib': sysconfig.get_paths()['purelib'],
    'version': kvstore_ext.__version__, 'dist_version': dist.version,
    'requires': dist.requires or [],
    'commands': sorted(e.name for e in dist.entry_points if e.group == 'console_scripts'),
}))
"""


def metadata() -> configparser.SectionProxy:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(os.path.join(REPO, "setup.cfg"))
    return cfg["metadata"]


def makefile_horovod_version() -> str:
    with open(os.path.join(REPO, "Makefile")) as f:
        found = re.search(r"^HOROVOD_VERSION\s*:?=\s*(\S+)", f.read(), re.M)
    assert found, "the Makefile names no HOROVOD_VERSION"
    return found.group(1)


def base_python() -> str:
    """The interpreter the running one's virtualenv was made from (itself outside a venv)."""
    exe = getattr(sys, "_base_executable", None)
    if exe and os.path.exists(exe):
        return exe
    with open(os.path.join(sys.prefix, "pyvenv.cfg")) as f:
        cfg = dict(map(str.strip, line.split("=", 1)) for line in f if "=" in line)
    return os.path.join(cfg["home"], f"python{sys.version_info[0]}.{sys.version_info[1]}")


def clean_env(**extra) -> dict:
    """This environment without what would put the checkout or another environment on
    sys.path, or let pip reach an index or the shared cache."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")
           and not k.startswith("PIP_")}
    # no pip configuration file either (it may name find-links or an index)
    env.update(PYTHONNOUSERSITE="1", PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1",
               PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
               PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def start(argv, cwd, env=None) -> subprocess.Popen:
    return subprocess.Popen([str(a) for a in argv], cwd=cwd, env=env or clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    """Wait for ``proc``; past ``timeout`` stop its process group (SIGTERM, which the
    launcher passes on to its job, then SIGKILL) and fail."""
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        out = ""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                out, _ = proc.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        pytest.fail(f"{' '.join(proc.args)} did not finish within {timeout} s:\n{out[-4000:]}")


def check(proc: subprocess.Popen, timeout: float) -> str:
    code, out = finish(proc, timeout)
    assert code == 0, f"{' '.join(proc.args)} exited {code}:\n{out[-4000:]}"
    return out


def check_all(procs, timeout: float) -> list[str]:
    """Wait for processes started together; any still running after a failure is killed."""
    try:
        return [check(proc, timeout) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()


def run(argv, cwd, timeout: float, env=None) -> str:
    return check(start(argv, cwd, env), timeout)


def dependency_links(folder) -> str:
    """A folder of links to every entry of the running interpreter's site-packages but this
    project's (its editable install and dist-info), for fresh virtualenvs to see through a .pth."""
    os.makedirs(folder)
    paths = sysconfig.get_paths()
    for site in dict.fromkeys((paths["purelib"], paths["platlib"])):
        for name in sorted(os.listdir(site)):
            key = re.split(r"[-.]", name)[0].lower()
            if key in PACKAGES or name.startswith("__editable__") or name.endswith(".pth") \
                    or name == "__pycache__":
                continue
            link = os.path.join(folder, name)
            if not os.path.lexists(link):
                os.symlink(os.path.join(site, name), link)
    return str(folder)


class Venv:
    def __init__(self, path):
        self.path = str(path)
        self.python = os.path.join(self.path, "bin", "python")

    def bin(self, name: str) -> str:
        return os.path.join(self.path, "bin", name)

    def see(self, folder: str, cwd) -> None:
        purelib = run([self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                      cwd, 60).strip()
        with open(os.path.join(purelib, "_kvx_test_dependencies.pth"), "w") as f:
            f.write(folder + "\n")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Build the wheel and create two virtualenvs (at once); install the wheel into one and the
    source tree into the other.  Returns (the wheel's path, {"wheel": Venv, "source": Venv}, a
    work folder outside the checkout)."""
    tmp = tmp_path_factory.mktemp("install")
    src, dist, work = tmp / "src", tmp / "dist", tmp / "work"
    work.mkdir()
    shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    venvs = {"wheel": Venv(tmp / "from_wheel"), "source": Venv(tmp / "from_source")}
    python = base_python()
    build = start([sys.executable, "-m", "pip", "wheel", src, "--no-deps", "--no-build-isolation",
                   "--no-index", "-w", dist], tmp)
    creating = {kind: start([python, "-m", "venv", v.path], tmp) for kind, v in venvs.items()}
    for kind, proc in creating.items():
        code, out = finish(proc, 240)
        if code != 0 and "ensurepip" in out:
            # a Python without ensurepip (Debian's without python3-venv): the venv gets no pip
            # of its own, and runs the one of the dependencies' folder (installing into itself)
            print(f"{python} has no ensurepip: {kind} venv created --without-pip")
            run([python, "-m", "venv", "--clear", "--without-pip", venvs[kind].path], tmp, 240)
        else:
            assert code == 0, f"{' '.join(proc.args)} exited {code}:\n{out[-4000:]}"
    check_all([build], 240)
    wheels = sorted(dist.glob("*.whl"))
    assert len(wheels) == 1, wheels
    deps = dependency_links(tmp / "deps")
    for v in venvs.values():
        v.see(deps, tmp)
    steps = [start([venvs["wheel"].python, "-m", "pip", "install", "--no-index", "--no-deps",
                    wheels[0]], work),
             # with the dependencies checked: pip finds them all installed (through the .pth)
             start([venvs["source"].python, "-m", "pip", "install", "--no-index",
                    "--no-build-isolation", src], work)]
    check_all(steps, 240)
    return wheels[0], venvs, work


def test_wheel_holds_every_package_module_and_command(installed):
    wheel, _, _ = installed
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names
                            if n.endswith(".dist-info/entry_points.txt"))
    for package in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(REPO, package)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            if "__init__.py" not in files:
                continue
            for name in files:
                if name.endswith(".py"):
                    path = os.path.relpath(os.path.join(folder, name), REPO).replace(os.sep, "/")
                    assert path in names, f"{path} is not in {wheel.name}"
    for sub in ("ps", "policies", "plan", "simulate", "launch", "horovod"):
        assert f"kvstore_ext/{sub}/__init__.py" in names
    assert "gluon_trainers/__init__.py" in names
    assert "kvstore_ext_launch.py" in names     # kvstore-launch's module, outside the package
    assert not any(n.startswith(("tests/", "scripts/", "configs/")) for n in names)
    for command in COMMANDS:
        assert re.search(rf"^{command} = ", entry_points, re.M), entry_points


@pytest.mark.parametrize("kind", ["wheel", "source"])
def test_installed_package_imports_from_the_venv_with_setup_cfg_metadata(installed, kind):
    _, venvs, work = installed
    venv = venvs[kind]
    info = json.loads(run([venv.python, "-c", PROBE], work, 120).strip().splitlines()[-1])
    site = os.path.realpath(info["purelib"])
    assert site.startswith(os.path.realpath(venv.path) + os.sep)
    for module, path in info["files"].items():
        path = os.path.realpath(path)
        assert path.startswith(site + os.sep), f"{module} imported from {path}, not {site}"
        assert not path.startswith(REPO + os.sep), f"{module} imported from the checkout"
    assert REPO not in map(os.path.realpath, filter(None, info["sys_path"]))

    meta = metadata()
    assert info["version"] == info["dist_version"] == meta["version"]
    requires = [r.replace(" ", "") for r in info["requires"]]
    base = [r for r in requires if "extra==" not in r]
    extras = [r for r in requires if "extra==" in r]
    assert "mxnet==1.9.1" in base and "numpy<1.24" in base, requires
    assert not any(r.startswith("horovod") for r in base), requires
    assert f'horovod=={makefile_horovod_version()};extra=="horovod"' in extras, requires
    assert info["commands"] == sorted(COMMANDS)


@pytest.mark.parametrize("kind", ["wheel", "source"])
def test_console_commands_and_module_entry_show_their_help(installed, kind):
    _, venvs, work = installed
    venv = venvs[kind]
    checks = {command: ([venv.bin(command), "--help"], options)
              for command, options in COMMANDS.items()}
    checks["python -m kvstore_ext.launch"] = ([venv.python, "-m", "kvstore_ext.launch", "--help"],
                                              COMMANDS["kvstore-launch"])
    # --train CONFIG hands the rest to reproduce's command line (in virtual time)
    checks["kvstore-simulate --train"] = ([venv.bin("kvstore-simulate"), "--train", "x.yaml",
                                           "--help"], ["--virtual", "--dry-run", "config"])
    procs = [start(argv, work) for argv, _ in checks.values()]   # all at once
    for (name, (_, options)), out in zip(checks.items(), check_all(procs, 120)):
        assert out.startswith("usage: "), f"{name}:\n{out[:2000]}"
        for option in options:
            assert option in out, f"{name} --help does not mention {option}:\n{out}"


def test_installed_launcher_runs_a_dist_bsp_job(installed):
    _, venvs, work = installed
    venv = venvs["wheel"]
    # -X importtime lists the launcher's own imports (its nodes do not inherit the flag)
    out = run([venv.python, "-X", "importtime", venv.bin("kvstore-launch"), "-n", "2", "-s", "1",
               "--launcher", "local", "--timeout", "100", venv.python, "-c", WORKER], work, 130)
    launcher_imports = [l for l in out.splitlines() if l.startswith("import time:")]
    assert any("kvstore_ext.launch" in l for l in launcher_imports), out[-4000:]
    assert not [l for l in launcher_imports if "mxnet" in l], "the launcher loaded mxnet"
    site = os.path.realpath(os.path.join(venv.path, "lib"))
    for rank in (0, 1):
        found = re.search(rf"worker {rank} pulled 3\.0 from (\S+)", out)
        assert found, f"worker {rank} printed no result:\n{out[-4000:]}"
        assert os.path.realpath(found.group(1)).startswith(site + os.sep), found.group(1)

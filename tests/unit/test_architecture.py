"""The package's shape: no import cycle, one registry row adds a store everywhere, the Horovod
stores without pyzmq."""
import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import JOBS, ROOT

PACKAGE = pathlib.Path(ROOT) / "kvstore_ext"
PKG = os.path.join(JOBS, "pkg")


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """The package's modules that ``name`` imports, at module level or inside functions."""
    path = MODULES[name]
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                target = ".".join(parts + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in MODULES:
                    found.add(f"{target}.{alias.name}")
                elif target in MODULES:
                    found.add(target)
    found.discard(name)
    return found


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, state = [], {}

    def visit(module, stack):
        state[module] = "open"
        stack.append(module)
        for other in sorted(graph[module]):
            if state.get(other) == "open":
                cycles.append(stack[stack.index(other):] + [other])
            elif other not in state:
                visit(other, stack)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    return cycles


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_no_import_cycle_in_the_package():
    """Lazy imports inside functions count too: a cycle through them is still a tangle."""
    graph = {name: imports_of(name) for name in MODULES}
    assert len(graph) > 30 and graph["kvstore_ext.ps.server"], graph
    assert find_cycles(graph) == []


def test_the_runtimes_stay_in_their_rooms():
    """The registry, the policies and the simulator need no transport; the Horovod side and
    the parameter-server side do not import each other (the registry reads both sides'
    parameter checks, which need neither runtime)."""
    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for other in imports_of(todo.pop()):
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
        return seen
    for light in ("kvstore_ext.registry", "kvstore_ext.simulate", "kvstore_ext.policies"):
        assert not {m for m in reach(light) if m.startswith(("kvstore_ext.ps", "kvstore_ext.launch"))}, light
    # the planner's model and search are arithmetic: the partitioner's pure placement rule, the
    # simulator and the policies, never a runtime, a launcher or the measuring side of the planner
    for light in ("kvstore_ext.plan.model", "kvstore_ext.plan.search"):
        heavy = {m for m in reach(light) if m.startswith(("kvstore_ext.ps", "kvstore_ext.launch",
                                                          "kvstore_ext.horovod"))
                 or m in ("kvstore_ext.plan.calibrate", "kvstore_ext.plan.jobs",
                          "kvstore_ext.plan.dcs3gd_jobs", "kvstore_ext.plan.validate")}
        assert heavy <= {"kvstore_ext.ps", "kvstore_ext.ps.partition", "kvstore_ext.ps.protocol",
                         "kvstore_ext.horovod",
                         "kvstore_ext.horovod.params"}, (light, heavy)   # the registry's checks
    assert not {m for m in reach("kvstore_ext.horovod.store") if m.startswith("kvstore_ext.ps")}
    assert not {m for m in reach("kvstore_ext.ps.store") if m.startswith("kvstore_ext.horovod.")
                and m != "kvstore_ext.horovod.params"}


@pytest.fixture
def toy_row():
    """The toy store registered in this process, and the registry as it was afterwards."""
    from kvstore_ext import registry
    before = dict(registry.STORES)
    sys.path.insert(0, PKG)
    try:
        assert "dist_lead1" not in registry.STORES
        import lead1_store  # noqa: F401  (its one row registers the store)
        yield registry.STORES["dist_lead1"]
    finally:
        sys.path.remove(PKG)
        sys.modules.pop("lead1_store", None)
        registry.STORES.clear()
        registry.STORES.update(before)


def test_one_registry_row_puts_a_toy_policy_in_the_simulator(toy_row):
    from kvstore_ext import StoreConfig, simulate
    assert StoreConfig.build("dist_lead1").type == "dist_lead1"
    assert "dist_lead1" in simulate.paradigms() and "dist_lead1" in {
        store for store, _ in simulate.paradigms().values()}
    toy = simulate.simulate("dist_lead1", {}, [1.0, 0.3, 0.6], horizon=300, jitter=0.3, seed=2)
    assert toy.max_lead_at_ok == 1
    # the same model as SSP with s = 1, written anew: the same run, iteration for iteration
    ssp1 = simulate.simulate("dist_ssp", {"staleness": 1}, [1.0, 0.3, 0.6], horizon=300,
                             jitter=0.3, seed=2)
    assert toy.iterations == ssp1.iterations and toy.leads == ssp1.leads


def test_a_bad_row_is_refused_with_its_name():
    from kvstore_ext.registry import StoreType
    with pytest.raises(ValueError, match="starts with 'dist_'.*got 'lead1'"):
        StoreType("lead1", "no dist_ prefix", policy=lambda w, p, r: None)
    with pytest.raises(ValueError, match="dist_nopolicy.*needs a policy"):
        StoreType("dist_nopolicy", "a parameter-server store without a model")


def test_without_pyzmq_import_kvstore_ext_still_gives_the_horovod_stores():
    code = """
import sys, json
sys.modules["zmq"] = None            # as if pyzmq were not installed
import kvstore_ext
import mxnet as mx
registered = sorted(mx.kvstore.KVStoreBase.kv_registry)
try:
    kvstore_ext.create("dist_bsp")
    error = None
except ImportError as exc:
    error = str(exc)
print(json.dumps({"registered": registered, "dcs3gd": kvstore_ext.DistDCS3GD.__name__,
                  "bsp_error": error, "zmq_loaded": sys.modules.get("zmq") is not None}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"dist_dcs3gd", "dist_ssgd"} <= set(result["registered"]), result
    assert "dist_bsp" not in result["registered"], result
    assert result["dcs3gd"] == "dist_dcs3gd" and not result["zmq_loaded"]
    assert "zmq" in result["bsp_error"], result


def test_no_job_program_hides_a_module_the_jobs_import():
    """A job runs with ``tests/jobs`` first on its path: a program there named like a module of
    ``tests/jobs/pkg`` (which jobs import by name) would be imported in its place."""
    programs = {p.stem for p in pathlib.Path(JOBS).glob("*.py")}
    modules = {p.stem for p in pathlib.Path(PKG).glob("*.py")}
    assert modules, PKG
    assert not programs & modules, sorted(programs & modules)

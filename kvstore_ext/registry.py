"""Every store type in one table: its name, parameters, synchronisation model, class and runtime.

Adding a synchronisation model is a policy (``kvstore_ext/policies/``), its tests, and one row::

    from kvstore_ext.registry import StoreType, register
    register(StoreType("dist_lead1", "At most one iteration ahead.",
                       policy=lambda workers, params, record: Lead1Policy(workers)))

After that, ``mx.kv.create('dist_lead1')`` and ``gluon.Trainer(..., kvstore='dist_lead1')``
work in any worker, the servers run the policy for every key, and the simulator
(``python -m kvstore_ext.simulate``) runs it too.  A row registered by a module outside
this package reaches every process of a job through ``launch.py --plugin MODULE``
(the ``KVX_PLUGINS`` variable), which each process imports on ``import kvstore_ext``.

Nothing here imports mxnet, pyzmq or horovod: the scheduler, the launcher and the
simulator read this table without them.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Callable

from .horovod.params import dcs3gd_params
from .jobenv import PLUGINS, STORE_PARAMS, params_from_env
from .policies import ASPPolicy, BSPPolicy, DSSPPolicy, SSPPolicy, SyncPolicy, check_staleness
from .policies.pool import PoolConfig, PoolPolicy
from .policies.psp import PartialPushPolicy, check_psp_params, resolve_min_pushes

#: the runtimes a store type can run on
PS = "ps"              # this project's scheduler, servers and worker links (ZeroMQ)
HOROVOD = "horovod"    # decentralised: workers only, allreduce over Horovod/Gloo


def no_params(params: dict) -> dict:
    return {}


class TypeName(str):
    """A store's ``kvstore.type``: its name, which also answers stock MXNet's substring
    checks as the name of the MXNet store whose scaling it keeps (``like``).

    MXNet tells stores apart by parts of ``kvstore.type``.  ``Module.init_optimizer`` scales
    gradients by 1 / (batch x workers) when the type holds ``'_sync'`` (one update of the
    summed pushes) and by 1 / batch otherwise; the older ``FeedForward`` by 1 / (batch x
    workers) unless it holds ``'_async'``; ``gluon.Trainer`` keeps updates on the servers
    when it holds ``'async'``.  ``'dist_bsp'`` holds none of them, so a Module script moved
    from ``dist_sync`` to it took steps as many times longer as there were workers.
    ``part in name`` is true when ``part`` is in the name or in ``like``; everything else
    (equality, hashing, printing, JSON, pickling) is the plain name's.
    """

    def __new__(cls, name: str, like: str | None = None):
        self = super().__new__(cls, name)
        self.like = str(like or name)
        return self

    def __contains__(self, part) -> bool:
        return str.__contains__(self, part) or part in self.like

    def __reduce__(self):
        return str, (str(self),)


@dataclass(frozen=True)
class StoreType:
    """One row of the table.

    ``policy(workers, params, record)`` builds the synchronisation model a server runs for
    one key (``record``: keep a log of decisions for the metrics); ``None`` for stores whose
    servers decide otherwise (``server_handler``) or that have no servers.  A store whose
    rounds are versions of a block (``dist_psp``) gives ``block_policy(workers, params)``
    instead, which the simulator runs.  ``pooled``: its servers keep workers outside a
    pool waiting.  ``told_of_barriers``: its servers may hold a worker until another
    pushes, so a worker tells them when it waits at a barrier (where it pushes nothing) and
    when it is through.  ``store_class``
    and ``server_handler`` are ``"module:attribute"`` strings, imported on first use, so that
    reading the table needs neither mxnet nor horovod.  ``examples`` are the labelled
    parameter settings the simulator compares by default.
    """

    name: str
    summary: str
    backend: str = PS
    params: tuple[str, ...] = ()
    check: Callable[[dict], dict] = no_params
    policy: Callable[..., SyncPolicy] | None = None
    block_policy: Callable[..., object] | None = None
    asynchronous: bool = False
    pooled: bool = False
    told_of_barriers: bool = False
    store_class: str | None = None
    server_handler: str | None = None
    examples: tuple[tuple[str, dict], ...] = ()

    def __post_init__(self):
        if not self.name.startswith("dist_") or self.name != self.name.lower():
            raise ValueError(f"a store type's name is lower case and starts with 'dist_' "
                             f"(MXNet's rule for distributed stores), got {self.name!r}")
        if self.backend not in (PS, HOROVOD):
            raise ValueError(f"store type {self.name!r}: backend must be {PS!r} or {HOROVOD!r}, "
                             f"got {self.backend!r}")
        if self.backend == PS and self.policy is None and self.server_handler is None:
            raise ValueError(f"store type {self.name!r}: a parameter-server store needs a "
                             f"policy (or a server_handler)")

    @property
    def mxnet_like(self) -> str | None:
        """The MXNet store whose gradient scaling this one keeps, for stock MXNet code that
        tells stores apart by their ``type`` (:class:`TypeName`): ``dist_async`` for the
        stores that apply each push, ``dist_sync`` for those that sum pushes into one update
        (``dist_bsp``, ``dist_psp``); None for the Horovod stores, which apply the workers'
        mean gradient as Horovod's ``DistributedTrainer`` does."""
        if self.backend != PS:
            return None
        return "dist_async" if self.asynchronous else "dist_sync"

    def type_name(self) -> "TypeName":
        """What the store's ``kvstore.type`` gives: the name, answering MXNet's checks as
        :attr:`mxnet_like`'s."""
        return TypeName(self.name, self.mxnet_like)

    def make_policy(self, workers, params: dict, record: bool = False) -> SyncPolicy:
        if self.policy is None:
            raise ValueError(f"no synchronisation model for store type {self.name!r}")
        return self.policy(workers, params, record)

    def settings(self) -> tuple[tuple[str, dict], ...]:
        return self.examples or ((self.name, {}),)


#: name -> row; ``STORE_TYPES`` is the same table (the name the rest of the code knows)
STORES: dict[str, StoreType] = {}
STORE_TYPES = STORES
_listeners: list[Callable[[StoreType], None]] = []


def register(row: StoreType) -> StoreType:
    """Add a row (or replace the row of the same name); the runtimes loaded so far learn of it."""
    STORES[row.name] = row
    for listener in list(_listeners):
        listener(row)
    return row


def on_register(listener: Callable[[StoreType], None]) -> None:
    """Call ``listener`` for every row, those there now and those registered later."""
    _listeners.append(listener)
    for row in list(STORES.values()):
        listener(row)


def lookup(name) -> StoreType:
    """The row of ``name`` (any case), or a ValueError naming the known types."""
    row = STORES.get(str(name).lower())
    if row is None:
        raise ValueError(f"unknown kvstore type {name!r}; kvstore_ext provides "
                         f"{', '.join(sorted(STORES))}")
    return row


def names(backend: str | None = None) -> list[str]:
    return sorted(n for n, row in STORES.items() if backend in (None, row.backend))


def is_horovod(name) -> bool:
    row = STORES.get(str(name).lower())
    return row is not None and row.backend == HOROVOD


def make_policy(store_type: str, workers, params: dict, record: bool = False) -> SyncPolicy:
    """The synchronisation model of ``store_type`` for one key held by a server."""
    row = STORES.get(store_type)
    if row is None or row.policy is None:
        raise ValueError(f"no synchronisation model for store type {store_type!r}")
    return row.make_policy(workers, params, record)


def load(spec: str):
    """The object a ``"module:attribute"`` string names."""
    module, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module), attribute)


def load_plugins(modules: str | None = None) -> list[str]:
    """Import the modules listed in ``KVX_PLUGINS`` (comma-separated); they register rows."""
    raw = os.environ.get(PLUGINS, "") if modules is None else modules
    loaded = []
    for module in (m.strip() for m in raw.split(",")):
        if module:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ImportError(f"{PLUGINS}: cannot import store plugin {module!r}: {exc}") \
                    from exc
            loaded.append(module)
    return loaded


def class_of(row: StoreType) -> type:
    """The row's ``mxnet.kvstore.KVStoreBase`` class (imports mxnet, and horovod's binding
    for a Horovod row, on first use)."""
    if row.store_class:
        return load(row.store_class)
    return load("kvstore_ext.ps.store:store_class")(row)


def job_config(store_type: str, explicit: dict, strict: bool = True) -> "StoreConfig":
    """The parameters a worker's store runs with: the job's (``launch.py --kv-param``, which
    may name parameters of other types too), overridden by those given to the constructor.

    ``strict``: a job parameter that no store type knows is an error (a typo, not a setting
    meant for another store).
    """
    row = lookup(store_type)
    from_job = params_from_env()
    if strict:
        known_anywhere = {p for other in STORES.values() for p in other.params}
        unknown = sorted(set(from_job) - known_anywhere)
        if unknown:
            raise ValueError(f"{STORE_PARAMS} names an unknown kvstore parameter {unknown[0]!r}")
    merged = {k: v for k, v in from_job.items() if k in row.params}
    merged.update(explicit)
    return StoreConfig.build(row.name, merged)


@dataclass(frozen=True)
class StoreConfig:
    """A store type with its validated parameters; every worker of a job must agree on it."""

    type: str
    params: dict

    @classmethod
    def build(cls, store_type: str, params: dict | None = None) -> "StoreConfig":
        row = lookup(store_type)
        params = dict(params or {})
        unknown = sorted(set(params) - set(row.params))
        if unknown:
            what = ", ".join(row.params) if row.params else "none"
            raise ValueError(f"unknown parameter {unknown[0]!r} for kvstore type {row.name!r} "
                             f"(its parameters: {what})")
        return cls(row.name, row.check(params))

    def describe(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.type}({inner})"

    def to_wire(self) -> dict:
        return {"type": self.type, "params": self.params}


# -- the rows of this package -------------------------------------------------------------------

def _ssp_params(params: dict) -> dict:
    return {"staleness": check_staleness("staleness", params.get("staleness", 3))}


def _dssp_params(params: dict) -> dict:
    lower = check_staleness("staleness_lower", params.get("staleness_lower", 3))
    upper = check_staleness("staleness_upper", params.get("staleness_upper", 15))
    if upper < lower:
        raise ValueError(f"staleness_upper must be >= staleness_lower, got "
                         f"staleness_lower={lower}, staleness_upper={upper}")
    rule = params.get("rule", "bounded")
    if rule not in DSSPPolicy.RULES:
        raise ValueError(f"rule must be 'bounded' (no OK above staleness_upper, the default) or "
                         f"'published' (the paper's Algorithm 1 as written), got {rule!r}")
    return {"staleness_lower": lower, "staleness_upper": upper, "rule": rule}


register(StoreType(
    "dist_bsp", "Bulk synchronous parallel: equals MXNet's dist_sync.",
    policy=lambda workers, params, record: BSPPolicy(workers), examples=(("BSP", {}),)))
register(StoreType(
    "dist_asp", "Asynchronous parallel: equals MXNet's dist_async.", asynchronous=True,
    policy=lambda workers, params, record: ASPPolicy(workers), examples=(("ASP", {}),)))
register(StoreType(
    "dist_ssp", "Stale synchronous parallel with staleness bound s.", params=("staleness",),
    check=_ssp_params, asynchronous=True, told_of_barriers=True,
    policy=lambda workers, params, record: SSPPolicy(workers, params["staleness"]),
    examples=(("SSP s=3", {"staleness": 3}), ("SSP s=15", {"staleness": 15}))))
register(StoreType(
    "dist_dssp", "Dynamic stale synchronous parallel: a per-worker bound in "
    "[staleness_lower, staleness_upper]; rule='published' runs the paper's Algorithm 1 as "
    "written.", params=("staleness_lower", "staleness_upper", "rule"),
    check=_dssp_params, asynchronous=True, told_of_barriers=True,
    policy=lambda workers, params, record: DSSPPolicy(
        workers, params["staleness_lower"], params["staleness_upper"], record=record,
        rule=params.get("rule", "bounded")),
    examples=(("DSSP 3..15", {"staleness_lower": 3, "staleness_upper": 15}),
              ("DSSP 3..15 pub", {"staleness_lower": 3, "staleness_upper": 15,
                                  "rule": "published"}))))
register(StoreType(
    "dist_pool", "Adaptable Asynchrony: asynchronous updates from a pool of workers whose size "
    "follows a schedule (progressive, dynamic, scripted), with the learning rate, batch size or "
    "momentum tuned to it.", params=PoolConfig.PARAMS,
    check=lambda params: PoolConfig.from_params(params).to_params(), asynchronous=True,
    pooled=True, told_of_barriers=True,
    policy=lambda workers, params, record: PoolPolicy(workers, PoolConfig.from_params(params)),
    examples=(("pool progressive", {"pool": "progressive"}),)))
register(StoreType(
    "dist_psp", "Partial push and partial pull (PSP-SGD).",
    params=("min_pushes", "min_pull_fraction", "push_timeout", "pull_timeout"),
    check=check_psp_params, store_class="kvstore_ext.ps.store:DistPSP",
    server_handler="kvstore_ext.ps.server_psp:PartialSyncHandler",
    block_policy=lambda workers, params: PartialPushPolicy.for_job(
        workers, resolve_min_pushes(params["min_pushes"], len(workers)), params),
    examples=(("PSP c=n", {}), ("PSP c=0.75n", {"min_pushes": 0.75}))))
register(StoreType(
    "dist_dcs3gd", "DC-S3GD: non-blocking allreduce of weight updates with delay compensation.",
    backend=HOROVOD, params=("lambda0",), check=dcs3gd_params,
    store_class="kvstore_ext.horovod.store:DistDCS3GD"))
register(StoreType(
    "dist_ssgd", "Synchronous SGD over Horovod's allreduce (the decentralised baseline).",
    backend=HOROVOD, store_class="kvstore_ext.horovod.store:DistSSGD"))

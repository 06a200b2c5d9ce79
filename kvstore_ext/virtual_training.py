"""Virtual-time training: a real Gluon model on real data, N virtual workers, one process.

The discrete-event simulator (:mod:`kvstore_ext.simulate`) orders the workers' pushes and
OKs in virtual time with the very policy objects the servers run; :class:`VirtualTraining`
rides on those events and trains.  When a worker starts an iteration it reads the weights
the policy lets it have (BSP: the round's; ASP/SSP/DSSP: the server's current weights at its
OK; PSP: for each server, the block version it holds, late blocks kept); when its push
reaches a server, its gradient is computed on its own mini-batch from exactly those weights
and gathered; when the policy says apply, the server's :class:`~kvstore_ext.optimizers.
ServerOptimizer` (what the real servers run) updates the weights.

Cost does not grow with N: one forward and backward per virtual iteration, and the weights a
worker read are kept by reference (one copy per weight version still in use), so memory is
bounded by the versions in flight.  The same seed gives the same weights, bit for bit.

    python -m kvstore_ext.simulate --train configs/virtual/mnist_16.yaml
"""
from __future__ import annotations

import contextlib
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from . import registry
from .experiments import histogram_mean, median_of, time_to_accuracy
from .ps.partition import Partitioner
from .reports import new_figure, save_figure

@dataclass
class Evaluation:
    time: float
    iterations: int
    accuracy: float


@dataclass
class TrainingLog:
    """What a virtual-time run recorded."""

    trace: list = field(default_factory=list)   # (worker, versions read, versions applied)
    staleness: Counter = field(default_factory=Counter)
    curve: list = field(default_factory=list)   # Evaluation
    iterations: Counter = field(default_factory=Counter)
    dropped: int = 0
    gradients: int = 0      # backward passes made: pushes but those every server dropped


def flatten_parameters(params) -> tuple[dict, dict, dict]:
    """Put the weights of ``params``, and their gradients, back to back in one flat NDArray
    of each dtype, every parameter's arrays becoming views into them: copying all the
    weights in, or summing all the gradients out, is then one operation instead of one per
    parameter (a virtual iteration does both).  Returns the flat weights and gradients
    (dtype -> NDArray) and where each parameter lies (index -> (dtype, offset)).

    Gluon keeps a parameter's arrays in ``_data`` and ``_grad``, one per context; the views
    take their place, holding the same values, and are marked for autograd as Gluon marks
    its own (``Parameter._init_grad``).  One context only (a virtual run computes on one)."""
    import mxnet as mx
    where, sizes = {}, {}
    for i, p in enumerate(params):
        if len(p.list_ctx()) != 1:
            raise ValueError(f"parameter {p.name}: virtual-time training computes on one "
                             f"context, not {p.list_ctx()}")
        if p.grad_req == "null":
            raise ValueError(f"parameter {p.name} has no gradient (grad_req 'null'): "
                             f"virtual-time training pushes every parameter's")
        data = p.data()
        dtype = np.dtype(data.dtype)
        where[i] = (dtype, sizes.get(dtype, 0))
        sizes[dtype] = where[i][1] + data.size
    flat_data = {dtype: mx.nd.zeros(size, dtype=dtype) for dtype, size in sizes.items()}
    flat_grad = {dtype: mx.nd.zeros(size, dtype=dtype) for dtype, size in sizes.items()}
    for i, p in enumerate(params):
        old = p.data()
        dtype, at = where[i]
        data = flat_data[dtype][at:at + old.size].reshape(old.shape)
        grad = flat_grad[dtype][at:at + old.size].reshape(old.shape)
        old.copyto(data)
        p._data, p._grad = [data], [grad]
        mx.autograd.mark_variables([data], [grad], p.grad_req)
    return flat_data, flat_grad, where


def contiguous_spans(parts) -> list[tuple]:
    """``parts`` (dtype, offset on one side, offset on the other, size), in order, joined
    where both sides continue the part before: each span is one slice on either side."""
    spans: list[list] = []
    for dtype, a, b, size in parts:
        last = spans[-1] if spans else None
        if last and last[0] == dtype and last[1] + last[3] == a and last[2] + last[3] == b:
            last[3] += size
        else:
            spans.append([dtype, a, b, size])
    return [tuple(span) for span in spans]


def objective_block(net, loss_fn):
    """A HybridBlock whose output is ``loss_fn`` of ``net`` on the rows ``idx`` of the
    training set (``xs``, ``ys``): what a virtual iteration differentiates."""
    from mxnet import gluon

    class _Objective(gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            self.net, self.loss = net, loss_fn

        def hybrid_forward(self, F, xs, ys, idx):
            return self.loss(self.net(F.take(xs, idx)), F.take(ys, idx))

    return _Objective()


class BoundObjective:
    """:func:`objective_block` bound once as an MXNet executor over the net's own weight and
    gradient arrays (views of the flat ones, :func:`flatten_parameters`): an iteration is a
    copy of the mini-batch's indices, a forward and a backward, with no autograd tape and no
    backward graph built per call.  LeNet at batch 8 on one thread: 2.67 ms of CPU an
    iteration against 3.0-3.2 for the hybridized block under ``autograd.record`` (2026-12-07),
    the same gradients bit for bit (the same operators, the loss's head gradient ones, as
    ``loss.backward()`` gives it)."""

    def __init__(self, net, loss_fn, params, x_train, y_train, batch_size: int):
        import mxnet as mx
        # MXNet logs its (CPU) subgraph backend at a process's first bind, amid the progress
        # bars; it fuses nothing in a graph that is differentiated (the same bits either way)
        os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")
        symbol = objective_block(net, loss_fn)(mx.sym.var("xs"), mx.sym.var("ys"),
                                               mx.sym.var("idx"))
        by_name = {p.name: p for p in params}
        self.idx = mx.nd.zeros((batch_size,))        # the rows of this iteration's mini-batch
        self.ones = mx.nd.ones((batch_size,))        # d(sum of the losses) / d(each loss)
        given = {"xs": x_train, "ys": y_train, "idx": self.idx}
        args, grads, reqs = {}, {}, {}
        for name in symbol.list_arguments():
            if name in given:
                args[name], reqs[name] = given[name], "null"
            else:
                p = by_name[name]
                args[name], grads[name], reqs[name] = p.data(), p.grad(), p.grad_req
        aux = {name: by_name[name].data() for name in symbol.list_auxiliary_states()}
        self.executor = symbol.bind(x_train.context, args=args, args_grad=grads,
                                    grad_req=reqs, aux_states=aux)

    def __call__(self, idx) -> None:
        """The gradients of the summed loss on the rows ``idx``, into the net's gradients."""
        idx.copyto(self.idx)
        self.executor.forward(is_train=True)
        self.executor.backward([self.ones])


class ServerState:
    """One virtual server, held as a real server holds its blocks: back to back in a flat
    array of each dtype (:class:`~kvstore_ext.optimizers.FlatArrays`: weights, the gathered
    gradients, the optimizer's momentum), updated a run of adjacent blocks at a time by its
    :class:`~kvstore_ext.optimizers.ServerOptimizer` (``apply_runs``, as the server calls
    it).  A copy of the weights at a version is taken when a worker first reads that version
    (every version under PSP, whose workers may read one later), one copy per dtype."""

    def __init__(self, index: int, blocks, values: dict, optimizer):
        from .optimizers import FlatArrays, Run, home_dtype
        self.index = index
        self.blocks = blocks                    # Partitioner blocks held here, in this order
        self.homes: dict = {}                   # key dtype -> FlatArrays (of home_dtype)
        self.places = []                        # per block: (key dtype, offset in its home)
        for b in blocks:
            dtype = values[b.key].dtype
            home = self.homes.get(dtype)
            if home is None:
                home = self.homes[dtype] = FlatArrays(home_dtype(dtype))
            self.places.append((dtype, home.add(b.size)))
        for b, (dtype, offset) in zip(blocks, self.places):
            self.homes[dtype].numpy("weight")[offset:offset + b.size] = \
                values[b.key].ravel()[b.start:b.stop]
        # runs of blocks adjacent in storage (one per dtype: blocks are added in order)
        self.runs = []
        for dtype, home in self.homes.items():
            mine = [(b, offset) for b, (dt, offset) in zip(blocks, self.places) if dt == dtype]
            self.runs.append(Run(home, [b.key for b, _ in mine],
                                 [offset for _, offset in mine] + [home.used]))
        self.gathered = 0
        self.pushers: list[int] = []            # whose gradients are gathered
        self.optimizer = optimizer
        self.version = 0
        self._snapshot: tuple[int, dict] | None = None   # (version, dtype -> weights copy)
        self.kept: dict[int, dict] = {}         # older versions some worker still holds (PSP)

    def live(self) -> dict:
        """The weights now, dtype -> flat NDArray (changed in place by the next update)."""
        return {dtype: home.array("weight")[:home.used] for dtype, home in self.homes.items()}

    def snapshot(self) -> dict:
        """A read-only copy of the weights at the current version, dtype -> flat NDArray, in
        the keys' dtype (a float16 key's rounded once, as a real server's reply is)."""
        if self._snapshot is None or self._snapshot[0] != self.version:
            self._snapshot = (self.version, {dtype: weights.astype(dtype)
                                             for dtype, weights in self.live().items()})
        return self._snapshot[1]

    def block_views(self, weights: dict) -> list:
        """Each block's part of ``weights`` (dtype -> flat NDArray), in the blocks' order."""
        return [weights[dtype][offset:offset + b.size]
                for b, (dtype, offset) in zip(self.blocks, self.places)]

    def gather(self, segments) -> None:
        """Sum a pushed gradient into the round's (float32 adds in arrival order, as the
        real server sums them): ``segments``, (gradient, the flat gradient's part it goes
        into) pairs."""
        for grad, acc in segments:
            if self.gathered:
                acc += grad if grad.dtype == acc.dtype else grad.astype(acc.dtype)
            else:
                grad.copyto(acc)   # casts a float16 gradient into its float32 home
        self.gathered += 1

    def apply(self, pusher=None) -> None:
        if not self.gathered:
            return
        self.optimizer.apply_runs(self.runs, pusher)
        self.gathered = 0
        self.version += 1


class VirtualTraining:
    """Trains ``net`` as the simulator's events say (see the module's docstring).

    ``make_optimizer()`` gives a fresh MXNet optimizer for each server, as the workers'
    ``set_optimizer`` gives each real server its own copy.
    """

    def __init__(self, net, store_type: str, num_workers: int, x_train, y_train, x_test,
                 y_test, batch_size: int, make_optimizer, servers: int = 1,
                 bigarray_bound: int = 1_000_000, seed: int = 0, eval_every: float = 0.0,
                 max_iterations: int = 0, record_trace: bool = False, progress=None,
                 patience: int = 0, eval_every_iterations: int = 0, min_delta: float = 0.0):
        import mxnet as mx
        from mxnet import gluon
        from .optimizers import ServerOptimizer
        self.mx, self.autograd = mx, mx.autograd
        self.row = registry.lookup(store_type)
        if self.row.policy is None and self.row.block_policy is None:
            raise ValueError(f"{store_type}: no synchronisation model to simulate "
                             f"(virtual-time training runs parameter-server stores)")
        if self.row.pooled:
            raise ValueError("dist_pool: a worker pool changes batch sizes and the learning "
                             "rate as it goes; virtual-time training does not run it yet")
        self.net = net
        self.params = list(net.collect_params().values())
        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        # the training set lives on MXNet's side once: a mini-batch is one gather, not a
        # synchronous copy from numpy per iteration
        self.x_train = mx.nd.array(x_train)
        self.y_train = mx.nd.array(y_train)
        self.num_train = len(x_train)
        self.x_test, self.y_test = x_test, y_test
        self.batch_size = batch_size
        if len(x_train) < batch_size:
            raise ValueError(f"batch_size {batch_size} is larger than the training set "
                             f"({len(x_train)} samples)")
        values = {i: p.data().asnumpy() for i, p in enumerate(self.params)}
        per_block = self.row.policy is None   # PSP: one policy per server, blocks move together
        self.num_servers = servers if per_block else 1
        part = Partitioner(self.num_servers, bigarray_bound)
        held_by = [[] for _ in range(self.num_servers)]
        for key, value in values.items():
            for block in part.blocks(key, value.size):
                held_by[block.server].append(block)
        self.servers = []
        for s, blocks in enumerate(held_by):
            optimizer = ServerOptimizer(make_optimizer(), self.row.name, self.row.asynchronous)
            self.servers.append(ServerState(s, blocks, values, optimizer))
        # the net's weights and gradients back to back (one flat array per dtype), and per
        # server the parts of them its blocks are: a block's weights are copied in from a
        # server, its gradient summed out into the server's (a push reaches every server in
        # one event, before the next backward: no copy of the gradient is kept); blocks that
        # lie in the same order on both sides move in one operation
        net_data, net_grad, where = flatten_parameters(self.params)
        # the mini-batch's gather, the net and the loss in one graph bound once over those
        # arrays (a block that is not hybrid runs under autograd, operator by operator)
        self.objective = None
        if isinstance(net, gluon.HybridBlock):
            self.objective = BoundObjective(net, self.loss_fn, self.params, self.x_train,
                                            self.y_train, batch_size)
        self.load_parts, self.gather_parts = [], []
        for state in self.servers:
            pairs = []
            for b, (dtype, offset) in zip(state.blocks, state.places):
                _, at = where[b.key]
                pairs.append((dtype, at + b.start, offset, b.size))
            spans = contiguous_spans(pairs)
            self.load_parts.append([(dtype, offset, net_data[dtype][at:at + size], size)
                                    for dtype, at, offset, size in spans])
            home = state.homes
            self.gather_parts.append([(net_grad[dtype][at:at + size],
                                       home[dtype].view("grad", offset, offset + size))
                                      for dtype, at, offset, size in spans])
        self._loaded: tuple | None = None       # the versions the net holds now
        self.rngs = [np.random.default_rng([seed, w]) for w in range(num_workers)]
        self.orders: list = [None] * num_workers   # each worker's shuffle, on MXNet's side
        self.cursor = [0] * num_workers
        self.reading: dict[int, tuple] = {}     # worker -> (versions, snapshots) it read
        self.log = TrainingLog()
        self.record_trace = record_trace
        self.eval_every = eval_every
        self.next_eval = 0.0
        # or when worker 0 is let go after every k-th iteration, as a launched run's worker 0
        # snapshots its weights after every k-th step (its --eval-interval)
        self.eval_every_iterations = eval_every_iterations
        self.max_iterations = max_iterations
        self.patience = patience      # evaluations without a new best accuracy that end the run
        self.min_delta = min_delta    # how much a new best must beat the old one by
        self.stopped_early = False
        self.pushes = 0
        self.now = 0.0
        self.progress = progress
        self._pending_trace: dict[int, list] = {}   # worker -> trace entry awaiting applies
        self._unsent = None     # (worker, mini-batch) of the push whose gradient is not made yet

    # -- what the simulator calls ------------------------------------------------------------
    def blocks_per_server(self) -> list[int]:
        return [len(s.blocks) for s in self.servers]

    def start(self, worker: int, held=None, at: float | None = None) -> None:
        """``worker`` reads the weights at virtual time ``at`` (default: the last event's):
        the servers' current ones, or (PSP) the versions in ``held`` (one per server); worker
        0 let go after its k-th iteration is a point of ``eval_every_iterations``' grid."""
        if held is None:
            chosen = [(s.version, s.snapshot()) for s in self.servers]
        else:
            chosen = []
            for s, version in zip(self.servers, held):
                snap = s.snapshot() if version == s.version else s.kept[version]
                chosen.append((version, snap))
        self.reading[worker] = tuple(chosen)
        for state, (_, snap) in zip(self.servers, chosen):
            if state.optimizer.delay_aware:   # as the server's sent_weights tells it
                for block, weight in zip(state.blocks, state.block_views(snap)):
                    state.optimizer.pulled(block.key, weight, worker)
        done = self.log.iterations[worker]
        if worker == 0 and self.eval_every_iterations and done \
                and done % self.eval_every_iterations == 0 and not self.stopped_early:
            # stamped with the moment worker 0 is let go (after the server's queue); the
            # servers' weights are the ones it reads then
            self._record_evaluation(self.now if at is None else at)

    def push(self, worker: int, server: int = 0, accepted: bool = True) -> None:
        """``worker``'s gradient reaches ``server`` (the simulator gives a push to every
        server, in order, within one event).  Its mini-batch is taken at the first server;
        the gradient is computed at the first server that accepts it, so a push every server
        drops as late (PSP: a fifth of them at 1,024 workers) costs no backward pass."""
        if server == 0:
            self._unsent = (worker, self._batch(worker))
            self.pushes += 1
            self.log.iterations[worker] += 1
            if self.record_trace:
                read = tuple(v for v, _ in self.reading[worker])
                entry = [worker, read, [None] * self.num_servers]
                self.log.trace.append(entry)
                self._pending_trace[worker] = entry
            if self.progress is not None:
                self.progress(self.now, self.pushes)
        state = self.servers[server]
        read_version = self.reading[worker][server][0]
        if accepted:
            if self._unsent is not None:
                self._backward(*self._unsent)
                self._unsent = None
                self.log.gradients += 1
            self.log.staleness[state.version - read_version] += 1
            state.gather(self.gather_parts[server])
            state.pushers.append(worker)
        else:
            self.log.dropped += 1

    def apply(self, server: int = 0, pusher: int | None = None) -> None:
        """The policy applies what ``server`` gathered (``pusher``: the one push's worker, on
        an asynchronous store, for a delay-aware optimizer)."""
        state = self.servers[server]
        delay = None
        if pusher is not None:
            delay = (pusher, state.version - self.reading[pusher][server][0])
        pushers, state.pushers = state.pushers, []
        if not state.gathered:
            return
        self._keep(state)
        state.apply(delay)
        if self.record_trace:
            for w in pushers:
                entry = self._pending_trace.get(w)
                if entry is not None and entry[2][server] is None:
                    entry[2][server] = state.version

    def advance(self, until: float) -> bool:
        """Evaluate at each ``eval_every`` point of virtual time up to ``until``; False when
        the run is over: ``max_iterations`` pushes made, or ``patience`` evaluations in a row
        below the best accuracy so far."""
        while self.eval_every and self.next_eval <= until and not self.stopped_early:
            self._record_evaluation(self.next_eval)
            self.next_eval += self.eval_every
        if self.stopped_early:
            return False
        self.now = until
        return not (self.max_iterations and self.pushes >= self.max_iterations)

    def _record_evaluation(self, at: float) -> None:
        """Evaluate on the test set at ``at``; the run stops once ``patience`` evaluations in
        a row have not beaten the best so far by more than ``min_delta``."""
        from .experiments import early_stop
        self.evaluate(at)
        if self.patience:
            errors = [-e.accuracy for e in self.log.curve]
            _, best = early_stop(errors, self.patience, self.min_delta)
            self.stopped_early = len(errors) - 1 - best >= self.patience

    # -- the model -----------------------------------------------------------------------------
    def _batch(self, worker: int):
        """The indices of the next mini-batch of ``worker``'s own pass over the training
        set (its own shuffle, seeded by the run's seed and its rank)."""
        start = self.cursor[worker]
        order = self.orders[worker]
        if order is None:
            self._first_shuffles()
            order = self.orders[worker]
        elif start + self.batch_size > order.shape[0]:
            order = self.orders[worker] = self.mx.nd.array(
                self.rngs[worker].permutation(self.num_train))
            start = 0
        self.cursor[worker] = start + self.batch_size
        return order[start:start + self.batch_size]

    def _first_shuffles(self) -> None:
        """Every worker's first shuffle, sent to MXNet in one copy: a copy from numpy waits
        for every operation queued before it, and one per worker stalls the engine n times."""
        fresh = [w for w, order in enumerate(self.orders) if order is None]
        orders = self.mx.nd.array(np.stack([self.rngs[w].permutation(self.num_train)
                                            for w in fresh]))
        for row, w in enumerate(fresh):
            self.orders[w] = orders[row]
            self.cursor[w] = 0

    def _load(self, reading) -> None:
        """Put the weights of ``reading`` (per server: version, weights by dtype) into the
        net, unless it holds those versions already (a BSP round's workers all read one)."""
        versions = tuple(v for v, _ in reading)
        if versions == self._loaded:
            return
        self._loaded = versions
        for (_, weights), parts in zip(reading, self.load_parts):
            for dtype, offset, into, size in parts:
                weights[dtype][offset:offset + size].copyto(into)

    def _current(self) -> tuple:
        """The servers' weights now, as a reading."""
        return tuple((s.version, s.live()) for s in self.servers)

    def _backward(self, worker: int, idx) -> None:
        """``worker``'s gradient on the mini-batch ``idx``, from the weights it read, into
        the net's gradient arrays."""
        self._load(self.reading[worker])
        if self.objective is not None:
            self.objective(idx)
            return
        data, label = self.mx.nd.take(self.x_train, idx), self.mx.nd.take(self.y_train, idx)
        with self.autograd.record():
            loss = self.loss_fn(self.net(data), label)
        loss.backward()

    def _keep(self, state: ServerState) -> None:
        """Keep the weights at ``state``'s version while a worker may still ask for them
        (PSP: a worker reads the version it holds, which may be old)."""
        if self.row.policy is not None:
            return
        kept = state.kept
        kept[state.version] = state.snapshot()
        oldest = min((r[state.index][0] for r in self.reading.values()), default=state.version)
        for v in [v for v in kept if v < oldest - 1]:
            del kept[v]

    def weights(self) -> list[np.ndarray]:
        """The servers' current weights, one array per parameter."""
        self._load(self._current())
        return [p.data().asnumpy() for p in self.params]

    def evaluate(self, at: float) -> float:
        from gluon_trainers.evaluation import evaluate
        self._load(self._current())
        accuracy = evaluate(self.net, self.x_test, self.y_test)
        self.log.curve.append(Evaluation(at, self.pushes, accuracy))
        return accuracy


# -- one run of an experiment's virtual cluster ------------------------------------------------

def _arg(args: dict, name: str, default):
    value = args.get(name, default)
    return default if value is None else value


#: the policy's log of decisions (DSSP's controller calls and bounds, as a real server's
#: metrics give them) is kept up to this many workers: it grows with the run, and beyond the
#: sizes real jobs run here there is nothing to compare it with
RECORD_UP_TO = 64


def run_virtual(exp, cluster: str, paradigm, trial: int, quick: bool = False,
                progress=None) -> dict:
    """One run of ``paradigm`` on ``exp``'s virtual ``cluster``, seeded by ``trial``: the
    record :func:`kvstore_ext.experiments.summarise` reads (as a launched run's), with the
    test accuracy of the servers' weights against virtual time, the staleness histogram and
    each worker's iterations.  ``progress(virtual seconds, pushes)`` is called as the run
    goes (every 50 pushes).

    The training script's arguments (the experiment's, the paradigm's over them) give the model
    (``model``), ``batch-size``, ``lr`` (the cluster's ``lr`` over it), ``momentum``, ``wd``, ``train-size``/``test-size`` of the shipped MNIST digits (``data``),
    ``max-time`` (virtual seconds) and ``max-steps`` (iterations per worker, on average).
    """
    import pickle

    import mxnet as mx
    from mxnet import gluon

    from gluon_trainers.data import load_mnist
    from gluon_trainers.models import MODELS
    from .simulate import simulate

    args = exp.run_args(paradigm, quick)
    opts = exp.cluster_options.get(cluster, {})
    if not exp.times_iterations(cluster):
        raise ValueError(f"{exp.name}: virtual cluster {cluster!r} needs device (the devices "
                         f"whose iteration times the virtual workers take) or compute: "
                         f"calibration (the planner's)")
    n = exp.workers_of(cluster)
    model = str(_arg(args, "model", "lenet"))
    if model not in MODELS:
        raise ValueError(f"{exp.name}: model {model!r} is not one of {', '.join(sorted(MODELS))}")
    batch = int(_arg(args, "batch-size", 64))
    horizon = float(_arg(args, "max-time", 60.0))
    per_worker = int(_arg(args, "max-steps", 0))
    x_train, y_train, x_test, y_test = load_mnist(args.get("data"),
                                                  int(_arg(args, "train-size", 8000)),
                                                  int(_arg(args, "test-size", 2000)))
    mx.random.seed(trial)
    np.random.seed(trial)
    net = MODELS[model]()
    net.initialize(mx.init.Xavier(magnitude=2.24))
    net(mx.nd.zeros((1,) + x_train.shape[1:]))
    # the optimizer as a worker's gluon.Trainer makes it and sends it to every server
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": float(opts.get("lr") or _arg(args, "lr", 0.05)),
                             "momentum": float(_arg(args, "momentum", 0.9)),
                             "wd": float(_arg(args, "wd", 1e-4))}, kvstore=None)
    optimizer = trainer._optimizer
    optimizer.rescale_grad = trainer._scale / batch     # what trainer.step(batch) sets
    blob = pickle.dumps(optimizer)
    servers = exp.servers if registry.lookup(paradigm.kvstore).policy is None else 1
    every_iterations = int(opts.get("eval_every_iterations", 0))
    eval_every = 0.0 if every_iterations else float(opts.get("eval_every") or horizon / 20)

    def moved(now: float, pushes: int) -> None:
        if pushes % 50 == 0:
            progress(now, pushes)

    vt = VirtualTraining(net, paradigm.kvstore, n, x_train, y_train, x_test, y_test, batch,
                         lambda: pickle.loads(blob), servers=servers, seed=trial,
                         eval_every=eval_every, eval_every_iterations=every_iterations,
                         max_iterations=per_worker * n,
                         progress=moved if progress else None,
                         patience=int(opts.get("patience", 0)),
                         min_delta=float(opts.get("min_delta", 0.0)))
    t0 = time.perf_counter()
    blocks = vt.blocks_per_server() if servers > 1 else None
    result = simulate(paradigm.kvstore, paradigm.params, None, horizon,
                      clocks=worker_clocks(exp, cluster, model, batch), servers=servers,
                      blocks=blocks, trainer=vt, seed=trial, record=n <= RECORD_UP_TO,
                      latency_jitter=float(opts.get("latency_jitter", 0.0)),
                      shared_host=shared_host(opts, model, batch),
                      **message_costs(opts, model, paradigm.kvstore, n, servers, batch))
    end = min(vt.now, horizon) if per_worker else horizon
    if vt.stopped_early:
        end = vt.log.curve[-1].time
    vt.advance(end)
    if not vt.log.curve or vt.log.curve[-1].time < end:
        vt.evaluate(end)
    samples = len(x_train)
    curve = [{"time_s": e.time, "step": e.iterations / n, "iterations": e.iterations,
              "epoch": e.iterations * batch / samples, "test_accuracy": e.accuracy}
             for e in vt.log.curve]
    staleness = dict(sorted(vt.log.staleness.items()))
    return {"trial": trial, "cluster": cluster, "paradigm": paradigm.name,
            "kvstore": paradigm.kvstore, "params": paradigm.params, "virtual": True,
            "workers": n, "speeds": exp.clusters[cluster],
            "job_seconds": time.perf_counter() - t0,
            "final_accuracy": curve[-1]["test_accuracy"], "train_time_s": end,
            "running_time_s": end, "pushes_dropped": vt.log.dropped,
            "iterations": [vt.log.iterations[w] for w in range(n)],
            "staleness": {str(k): v for k, v in staleness.items()},
            "staleness_mean": histogram_mean(staleness),
            "max_lead": result.max_lead_at_ok, "curve": curve,
            "dssp": result.report.get("dssp"),     # DSSP's controller, as a server reports it
            "stopped_early": vt.stopped_early,
            "train_start_wall": None, "wait_share": None}


def read_calibration(path: str) -> dict:
    """A ``plan calibrate`` JSON a virtual cluster names, or an error saying how to make it."""
    from .plan.calibrate import load
    if not os.path.exists(path):
        raise ValueError(f"calibration {path!r} does not exist: make it with "
                         f"'python -m kvstore_ext.plan calibrate --out {path}'")
    return load(path)


def worker_clocks(exp, cluster: str, model: str, batch: int) -> list:
    """Each virtual worker's :class:`~kvstore_ext.devices.DeviceClock`: the cluster's emulated
    devices, or with ``compute: calibration`` the planner's compute of ``model`` at ``batch``
    on the calibrated machine (:meth:`~kvstore_ext.plan.model.ModelProfile.host_time`: the
    host alone), slowed by the calibration's interference when ``workers_per_host`` workers
    compute on one host (default 1: a host each), divided by each worker's speed (the
    cluster's ``speeds``); the straggler patterns multiply either, draw for draw."""
    opts = exp.cluster_options[cluster]
    if opts.get("compute") != "calibration":
        return exp.device_clocks(cluster)
    from .devices import DeviceClock, parse_pattern
    from .plan.model import Costs, ModelProfile
    data = read_calibration(opts["calibration"])
    seconds = float(ModelProfile.from_calibration(data, model).host_time(batch))
    seconds *= float(Costs.from_calibration(data).interference_at(
        int(opts.get("workers_per_host", 1))))
    if not seconds > 0:
        raise ValueError(f"calibration {opts['calibration']!r}: {model} computes a batch of "
                         f"{batch} in {seconds} s; a virtual worker needs a time > 0")
    n, seed = exp.workers_of(cluster), int(opts.get("speed_seed", 0))
    patterns = [str(p) for p in opts.get("patterns", [])]
    return [DeviceClock(seconds / speed, [parse_pattern(p, rank, n, seed, i)
                                          for i, p in enumerate(patterns)])
            for rank, speed in enumerate(exp.clusters[cluster])]


def message_costs(opts: dict, model: str, store: str, workers: int, servers: int,
                  batch: int) -> dict:
    """What a virtual cluster adds per message: its ``latency`` and ``service`` (service only
    with one server and a server-wide policy), or with ``calibration`` the planner's model of
    this job on the calibrated machine (:func:`kvstore_ext.plan.model.message_delays`)."""
    if opts.get("calibration"):
        from .plan.model import message_delays
        return message_delays(read_calibration(opts["calibration"]), model, store, workers,
                              servers, batch)
    server_wide = servers == 1 and registry.lookup(store).policy is not None
    return {"latency": float(opts.get("latency", 0.0)),
            "service": float(opts.get("service", 0.0)) if server_wide else 0.0}


def shared_host(opts: dict, model: str, batch: int):
    """The workers' exchanges on one host's cores (:class:`~kvstore_ext.simulate.SharedHost`),
    with the calibration's compute of ``model`` at ``batch`` as each iteration's host work:
    ``shared_host: true`` slows an exchange beside k others' compute by the calibration's
    interference at k + 1 processes; ``shared_host: f`` (a number) by 1 + (f - 1) k, f being an
    exchange's slow-down beside one other's compute, measured on the machine.  None without
    it (a host each)."""
    value = opts.get("shared_host", False)
    if value is False:
        return None
    from .plan.model import Costs, ModelProfile
    from .simulate import SharedHost
    data = read_calibration(opts["calibration"])
    if value is True:
        interference = Costs.from_calibration(data).interference_at
    else:
        def interference(k, f=float(value)):
            return 1.0 + (f - 1.0) * (k - 1)
    return SharedHost(float(ModelProfile.from_calibration(data, model).host_time(batch)),
                      interference)


# -- runs in parallel processes ----------------------------------------------------------------

#: a virtual run's process computes on one thread: fewer CPU-seconds per run than two threads
#: here, and the same bits whatever the machine's cores (MXNet's OpenMP kernels split their
#: sums by the number of threads: a run on two threads differs from one on one in the last bits)
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


class RunProgress:
    """A tqdm bar of one virtual run: virtual seconds out of ``max-time``, or when the run
    ends by ``max-steps``, iterations out of ``max-steps`` x n."""

    def __init__(self, exp, cluster: str, paradigm, quick: bool):
        from tqdm import tqdm
        args = exp.run_args(paradigm, quick)
        n = exp.workers_of(cluster)
        per_worker = int(_arg(args, "max-steps", 0))
        self.by_pushes = bool(per_worker)
        total = per_worker * n if per_worker else round(float(_arg(args, "max-time", 60.0)), 1)
        unit = "{n:.0f}/{total} iterations" if self.by_pushes else "{n:.1f}/{total} virtual s"
        self.bar = tqdm(total=total, desc=f"{cluster} {paradigm.name} n={n}", leave=False,
                        bar_format="{l_bar}{bar}| " + unit + " [{elapsed}<{remaining}]")

    def moved(self, now: float, pushes: int) -> None:
        done = pushes if self.by_pushes else round(now, 1)
        self.bar.update(min(done, self.bar.total) - self.bar.n)

    def close(self) -> None:
        self.bar.close()


_progress_queue = None     # in a run's process: where it reports (plan index, now, pushes)


def _start_process(queue) -> None:
    global _progress_queue
    _progress_queue = queue


def _run_in_process(index: int, exp, cluster: str, paradigm, trial: int, quick: bool) -> dict:
    def report(now: float, pushes: int) -> None:
        _progress_queue.put((index, now, pushes))
    return run_virtual(exp, cluster, paradigm, trial, quick, progress=report)


@contextlib.contextmanager
def _environment(variables: dict):
    """``os.environ`` with ``variables`` set, as it was afterwards."""
    saved = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_virtual_runs(exp, plan, quick: bool = False, jobs: int = 1, progress: bool = True):
    """Run the ``(trial, cluster, paradigm)`` of ``plan`` (virtual clusters) in ``jobs``
    processes, each on one thread (:data:`ONE_THREAD`); yield ``(index in plan, record)`` as
    each run ends.  Runs are independent and seeded by their trial, so the records are the
    same bits whatever ``jobs`` is and whichever process a run lands in; a bar per running
    run shows its progress (:class:`RunProgress`)."""
    import multiprocessing
    import queue as queues
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    if not plan:
        return
    context = multiprocessing.get_context("spawn")
    reports = context.Queue()
    # the processes start (and import MXNet) within submit: they take this environment
    with _environment(ONE_THREAD):
        pool = ProcessPoolExecutor(min(jobs, len(plan)), mp_context=context,
                                   initializer=_start_process, initargs=(reports,))
        index_of = {pool.submit(_run_in_process, i, exp, cluster, paradigm, trial, quick): i
                    for i, (trial, cluster, paradigm) in enumerate(plan)}
    bars: dict[int, RunProgress] = {}
    finished: set[int] = set()

    def show_reports() -> None:
        while True:
            try:
                i, now, pushes = reports.get_nowait()
            except queues.Empty:
                return
            if progress and i not in bars and i not in finished:
                _, cluster, paradigm = plan[i]
                bars[i] = RunProgress(exp, cluster, paradigm, quick)
            if i in bars:
                bars[i].moved(now, pushes)
    try:
        pending = set(index_of)
        while pending:
            done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            show_reports()
            for future in sorted(done, key=index_of.get):
                i = index_of[future]
                finished.add(i)
                if i in bars:
                    bars.pop(i).close()
                yield i, future.result()
    finally:   # all done, or a run failed: the runs not started are dropped
        pool.shutdown(wait=False, cancel_futures=True)
        for bar in bars.values():
            bar.close()


def plot_staleness(runs: list[dict], rows: list[dict], cluster: str, path: str, title: str) -> bool:
    """Histogram of the staleness of applied pushes (updates since the pusher read the
    weights) of each paradigm's median trial; False if no run of ``cluster`` has one."""
    chosen = [median_of(runs, row) for row in rows if row["cluster"] == cluster]
    chosen = [r for r in chosen if r.get("staleness")]
    if not chosen:
        return False
    fig, ax = new_figure()
    top = max(int(k) for run in chosen for k in run["staleness"])
    bins = np.linspace(0, top + 1, min(top + 2, 60))   # shared bins; a one-value run is a bar
    for run in chosen:
        values = [int(k) for k in run["staleness"]]
        counts = list(run["staleness"].values())
        total = sum(counts)
        ax.hist(values, bins=bins, weights=[c / total for c in counts], histtype="step",
                linewidth=1.5, label=f"{run['paradigm']} (mean {run['staleness_mean']:.1f})")
    ax.set_xlabel("staleness of an applied push (updates since its weights were read)")
    ax.set_ylabel("share of applied pushes")
    save_figure(fig, ax, title, path)
    return True


def cluster_kinds(exp) -> dict[str, list[str]]:
    """The virtual clusters of ``exp`` by kind: a scaling study names its clusters
    ``<kind>_<n>`` (``transient_8``, ``transient_32``, ...)."""
    kinds: dict[str, list[str]] = {}
    for name in exp.clusters:
        if exp.is_virtual(name):
            kinds.setdefault(re.sub(r"[_-]?\d+$", "", name) or name, []).append(name)
    return kinds


def plot_time_to_target(rows: list[dict], exp, target: float, clusters: list[str], path: str,
                        title: str) -> bool:
    """Virtual time to ``target`` (median of seeds) against the number of workers, one line
    per paradigm, over ``clusters`` (one kind, several sizes); False when fewer than two
    sizes.  A paradigm that did not reach the target at a size has no point there."""
    mine = [r for r in rows if r["cluster"] in clusters]
    if len({exp.workers_of(c) for c in clusters}) < 2 or not mine:
        return False
    fig, ax = new_figure()
    for name in dict.fromkeys(r["paradigm"] for r in mine):
        points = sorted((exp.workers_of(r["cluster"]), r.get(f"median_time_to_{target}"))
                        for r in mine if r["paradigm"] == name)
        xs = [n for n, t in points if isinstance(t, (int, float))]
        ys = [t for n, t in points if isinstance(t, (int, float))]
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("workers")
    ax.set_ylabel(f"virtual time to {target} test accuracy (s, median of seeds)")
    save_figure(fig, ax, title, path)
    return True


def iterations_text(iterations) -> str:
    """Iterations per worker for a table: each worker's, or for many, the range and mean."""
    iterations = list(iterations or [])
    if len(iterations) <= 8:
        return "/".join(str(i) for i in iterations)
    return (f"{min(iterations)}..{max(iterations)} "
            f"(mean {sum(iterations) / len(iterations):.1f})")


# -- virtual time against real jobs -------------------------------------------------------------

#: how close a virtual cluster must come to a real one on the same devices (medians over seeds
#: against medians over trials): relative for iterations, staleness and time, points for accuracy
AGREEMENT = {"iterations": 0.05, "staleness": 0.10, "accuracy_points": 1.5, "time": 0.15}


def _median(values):
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def _relative(virtual, real, floor: float = 0.0):
    """``virtual / real - 1``; with ``real`` at or below ``floor``, 0 when both are (BSP's
    staleness), else None (no ratio to take)."""
    if virtual is None or real is None:
        return None
    if real <= floor:
        return 0.0 if virtual <= floor else None
    return virtual / real - 1


def _paired(groups, of):
    """With each launched trial seeded as the virtual run of the same number
    (``seed_by_trial``): the median over trials of ``virtual / real - 1``, seed against
    seed, where both have a value. The medians of each side may come from different seeds; a
    time to target that one seed's curve crosses an evaluation later differs by a grid step."""
    real, virtual = ({r.get("trial"): of(r) for r in g} for g in groups)
    return _median([_relative(virtual[t], real[t]) for t in real if t is not None and t in virtual])


def agreement_pairs(exp) -> list[tuple[str, str]]:
    """(real cluster, virtual cluster) pairs of ``exp`` on the same devices, patterns, seed and
    number of workers."""
    same = ("device", "patterns", "speed_seed", "device_model", "device_batch")
    pairs = []
    for virtual in exp.clusters:
        if not exp.is_virtual(virtual):
            continue
        v = exp.cluster_options[virtual]
        for real in exp.clusters:
            r = exp.cluster_options.get(real, {})
            if (not exp.is_virtual(real) and exp.uses_devices(real)
                    and all(r.get(k) == v.get(k) for k in same)
                    and exp.workers_of(real) == exp.workers_of(virtual)):
                pairs.append((real, virtual))
    return pairs


def _mean_rank_gap(x, y, axis=-1):
    """Mean rank of ``x`` minus mean rank of ``y`` in the two pooled (ties share a rank)."""
    from scipy.stats import rankdata
    ranks = rankdata(np.concatenate([x, y], axis=axis), axis=axis)
    k = x.shape[axis]
    return ranks[..., :k].mean(axis=-1) - ranks[..., k:].mean(axis=-1)


def _rank_test(groups, of, missing=None):
    """Two-sided rank test of real runs against virtual ones (Mann-Whitney's statistic, its p
    by permutation: exact up to 20,000 splits, ties counted as they fall): whether the two
    sides' values (one per run) differ by more than the runs of one side differ among
    themselves.  ``missing`` stands in for a run without a value (a target never reached: it
    ranks last).  None with fewer than two runs a side.  With three a side the smallest p is
    0.1, so no difference can be told from the seeds' spread: ``--trials 8`` can."""
    from scipy.stats import permutation_test
    sides = [[v if v is not None else missing for v in map(of, g)] for g in groups]
    sides = [[v for v in side if v is not None] for side in sides]
    if min(len(side) for side in sides) < 2:
        return None
    return float(permutation_test(sides, _mean_rank_gap, permutation_type="independent",
                                  alternative="two-sided", n_resamples=20_000, vectorized=True,
                                  random_state=0).pvalue)


#: below this p a difference outside a bound is more than the seeds' own spread
APART_P = 0.05


def agreement_rows(runs: list[dict], exp) -> list[dict]:
    """Per paradigm, each virtual cluster against its real one (:func:`agreement_pairs`):
    medians of the mean iterations per worker, of the mean staleness, of the final accuracy and
    of the time to the first target, their differences and whether each is within
    :data:`AGREEMENT`; for accuracy and time, which vary most from seed to seed, also whether
    the runs of the two sides differ beyond that variation (:func:`_rank_test`)."""
    target = exp.targets[0] if exp.targets else None
    rows = []
    for real, virtual in agreement_pairs(exp):
        for paradigm in exp.paradigms:
            groups = [[r for r in runs if r["cluster"] == c and r["paradigm"] == paradigm.name]
                      for c in (real, virtual)]
            if not all(groups):
                continue
            row = {"real": real, "virtual": virtual, "pair": f"{real} / {virtual}",
                   "paradigm": paradigm.name, "runs": f"{len(groups[0])}/{len(groups[1])}"}
            measures = {
                "iterations": lambda r: float(np.mean(r["iterations"])),
                "staleness": lambda r: r.get("staleness_mean"),
                "accuracy": lambda r: r["final_accuracy"],
                "time": lambda r: time_to_accuracy(r["curve"], target) if target else None}
            for name, of in measures.items():
                row[f"{name}_real"], row[f"{name}_virtual"] = (_median([of(r) for r in g])
                                                               for g in groups)
            row["iterations_diff"] = _relative(row["iterations_virtual"], row["iterations_real"])
            row["staleness_diff"] = _relative(row["staleness_virtual"], row["staleness_real"],
                                              floor=0.05)
            row["time_diff"] = _relative(row["time_virtual"], row["time_real"])
            row["time_paired_diff"] = _paired(groups, measures["time"]) \
                if exp.seed_by_trial else None
            row["accuracy_diff_points"] = 100 * (row["accuracy_virtual"] - row["accuracy_real"])
            reached = [row["time_real"] is not None, row["time_virtual"] is not None]
            row["agrees"] = {
                "iterations": row["iterations_diff"] is not None
                and abs(row["iterations_diff"]) <= AGREEMENT["iterations"],
                "staleness": row["staleness_diff"] is not None
                and abs(row["staleness_diff"]) <= AGREEMENT["staleness"],
                "accuracy": abs(row["accuracy_diff_points"]) <= AGREEMENT["accuracy_points"],
                # neither reaching the target agrees too; one of them only does not
                "time": (row["time_diff"] is not None
                         and abs(row["time_diff"]) <= AGREEMENT["time"]) or not any(reached)}
            row["within"] = ", ".join(k for k, ok in row["agrees"].items() if ok) or "-"
            row["outside"] = ", ".join(k for k, ok in row["agrees"].items() if not ok) or "-"
            row["accuracy_p"] = _rank_test(groups, measures["accuracy"])
            row["time_p"] = _rank_test(groups, measures["time"], missing=float("inf")) \
                if target else None
            row["apart"] = ", ".join(
                k for k in ("accuracy", "time") if not row["agrees"][k]
                and row[f"{k}_p"] is not None and row[f"{k}_p"] < APART_P) or "-"
            rows.append(row)
    return rows


def agreement_columns(target) -> list[tuple[str, str, str]]:
    pct = "{:+.1%}"
    return [("paradigm", "paradigm", "{}"), ("clusters", "pair", "{}"),
            ("runs", "runs", "{}"),
            ("iterations/worker real", "iterations_real", "{:.1f}"),
            ("virtual", "iterations_virtual", "{:.1f}"), ("diff (≤5%)", "iterations_diff", pct),
            ("staleness real", "staleness_real", "{:.2f}"),
            ("virtual", "staleness_virtual", "{:.2f}"), ("diff (≤10%)", "staleness_diff", pct),
            ("final acc real", "accuracy_real", "{:.3f}"),
            ("virtual", "accuracy_virtual", "{:.3f}"),
            ("diff, points (≤1.5)", "accuracy_diff_points", "{:+.1f}"),
            (f"time to {target} real (s)", "time_real", "{:.1f}"),
            ("virtual", "time_virtual", "{:.1f}"), ("diff (≤15%)", "time_diff", pct),
            ("seed by seed (median)", "time_paired_diff", pct),
            ("outside the bounds", "outside", "{}"),
            ("accuracy p", "accuracy_p", "{:.2f}"), ("time p", "time_p", "{:.2f}"),
            (f"outside, and apart beyond the seeds' spread (p < {APART_P})", "apart", "{}")]

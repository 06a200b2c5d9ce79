"""CPU per push+pull round of a whole job, sockets against shared-memory lanes, in one run.

    python scripts/bench_lanes.py                       (make bench-lanes)
    python scripts/bench_lanes.py --model cifar_resnet20_v1 --mode list --trials 5

Runs ``bench_kvstore.py``'s job (the model's trainable shapes, pushed and pulled with
server-side momentum SGD, 2 workers and 1 server on this machine) with ``--no-shm`` and
without, trial by trial interleaved. Each case runs twice, ``--rounds`` and 20 rounds; the
difference of the job's processes' CPU time (user and system, ``getrusage`` of this
process's children: scheduler, server, workers) over the difference of rounds is the CPU of a
round without the processes' start. CPU time, unlike rounds a second, moves little when
another process shares the machine. Writes lanes.json and lanes.md to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_kvstore  # noqa: E402

SHORT = 20


def job_cpu() -> tuple[float, float]:
    """User and system seconds of every child process waited for so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime, r.ru_stime


def one_trial(shapes, mode: str, workers: int, servers: int, rounds: int, lanes: bool,
              tmp: str) -> dict:
    os.environ["KVX_SHM"] = "1" if lanes else "0"
    seen = {}
    for n in (SHORT, rounds):
        u0, s0 = job_cpu()
        rate = bench_kvstore.run_case("dist_bsp", "kvstore_ext", mode, shapes, workers, servers,
                                      n, 5, tmp)
        u1, s1 = job_cpu()
        seen[n] = (u1 - u0, s1 - s0, rate)
    per = 1e3 / (rounds - SHORT)
    user = (seen[rounds][0] - seen[SHORT][0]) * per
    system = (seen[rounds][1] - seen[SHORT][1]) * per
    return {"cpu_ms": user + system, "system_ms": system, "rounds_per_s": seen[rounds][2]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--model", default="lenet",
                   help="model whose trainable shapes are pushed (default lenet: 8 keys, one "
                        "1.6 MB array)")
    p.add_argument("--mode", choices=("per-key", "list"), default="per-key",
                   help="one call per key, as stock gluon.Trainer makes them, or one list call "
                        "per round (default per-key)")
    p.add_argument("--cluster", default="2x1", help="WORKERSxSERVERS (default 2x1)")
    p.add_argument("--rounds", type=int, default=1020,
                   help="rounds of the long run of each case (default 1020; the short one: 20)")
    p.add_argument("--trials", type=int, default=3,
                   help="trials of each case, interleaved; medians reported (default 3)")
    p.add_argument("--out", default="results/bench", help="folder for lanes.json and lanes.md")
    args = p.parse_args(argv)
    if args.rounds <= SHORT:
        p.error(f"--rounds must be above {SHORT}")
    workers, servers = (int(x) for x in args.cluster.split("x"))
    from tqdm import tqdm
    from kvstore_ext.plan.jobs import model_shapes
    shapes = [list(s) for s in model_shapes(args.model)]
    os.makedirs(args.out, exist_ok=True)
    trials = {"sockets": [], "lanes": []}
    with tqdm(total=2 * args.trials, desc="trials", unit="job pair") as bar:
        for _ in range(args.trials):
            for case in trials:
                trials[case].append(one_trial(shapes, args.mode, workers, servers, args.rounds,
                                              case == "lanes", args.out))
                bar.update()
    rows = []
    for case, got in trials.items():
        rows.append({"case": case, **{k: statistics.median(t[k] for t in got)
                                      for k in ("cpu_ms", "system_ms", "rounds_per_s")},
                     "trials": got})
    sockets, lanes = rows
    lines = [f"{args.model} shapes, {args.cluster}, {args.mode} calls, dist_bsp, "
             f"{args.rounds - SHORT} rounds, medians of {args.trials} interleaved trials",
             "", "| transport | CPU ms a round (all processes) | of it system | rounds/s |",
             "| --- | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['cpu_ms']:.2f} | {r['system_ms']:.2f} | "
                     f"{r['rounds_per_s']:.1f} |")
    lines.append("")
    lines.append(f"lanes / sockets: CPU {lanes['cpu_ms'] / sockets['cpu_ms']:.2f}x, "
                 f"rounds/s {lanes['rounds_per_s'] / sockets['rounds_per_s']:.2f}x")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "lanes.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "lanes.json"), "w") as f:
        json.dump({"model": args.model, "mode": args.mode, "cluster": args.cluster,
                   "rounds": args.rounds - SHORT, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

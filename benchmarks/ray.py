"""What crosses process (and, on a cluster, machine) boundaries per step, and what it costs: the serial,
multiprocessing and Ray backends side by side on this machine.

For CartPole-v1 (16 bytes of observation) and the 12 KB Dict env with a 100 us step (StructuredEnv,
busy_us=100), with --envs envs on --workers workers:

- bytes per step: for Ray, the request (the checked action rows) and the reply (rows, rewards, flags,
  masks, changed final rows, infos) of one worker, pickled as Ray pickles them (protocol 5, numpy buffers
  out of band; the median over --wire-steps steps, episode ends included); for multiprocessing, what goes
  through the pipes (infos only: rows and actions live in shared memory, written in place);
- round trips per step: messages the main process sends and waits for (one per worker and step for both
  worker backends; none for serial);
- agent-steps/s and us per step, median of --repeats runs of --seconds, with the ratio to serial; for Ray
  also the main process's CPU time per reply (what one learner process spends per actor per step, the
  number that bounds how many actors one learner can feed from).

Then an estimate for a cluster of 4, 16 and 64 env machines (--node-cores cores each, one actor per core,
--envs-per-actor envs each) feeding --ranks learner ranks on one learner machine (--nic-gbps of network, a
round trip of --rtt-us between machines: assumptions, not measured here), from the numbers measured above:
per rank and synchronous step, T = E * t_env + rtt + A * c, where E = envs per actor, t_env = the serial
backend's time per env step, A = actors per rank and c = the main process's CPU per reply; throughput is
ranks * A * E / T, capped by the learner machine's network (bytes per env step) and named by what limits it.

Usage: python benchmarks/ray.py [--seconds 1] [--repeats 3] [--envs 8] [--workers 2]
Ray starts a local cluster of --workers CPUs (about 10 s).
"""
from __future__ import annotations

import sys
from pathlib import Path

# This file is named ray.py: with its folder first on sys.path (how Python runs a script), ``import ray``
# would find it instead of Ray. Its folder goes to the end of sys.path, so Ray is found first and
# ``common`` still is; imported as ``ray`` by a script of this folder, it hands over the real Ray.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]
if __name__ == "ray":
    del sys.modules["ray"]
    import ray  # noqa: F401 - the real Ray replaces this module in sys.modules
else:
    import argparse
    import functools
    import pickle
    import statistics
    import time

    import gymnasium
    import numpy as np
    from common import machine_line

    from packrl import vector
    from packrl.vector.testing import StructuredEnv

    ENVS = {
        "CartPole-v1": functools.partial(gymnasium.make, "CartPole-v1"),
        "Dict 12KB +100us": functools.partial(StructuredEnv, busy_us=100.0),
    }
    BACKENDS = ("serial", "multiprocessing", "ray")


def pickled_bytes(value: object) -> int:
    """Bytes of ``value`` pickled as Ray ships it: protocol 5, buffers out of band (counted once)."""
    buffers: list = []
    inline = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return len(inline) + sum(memoryview(b.raw()).nbytes for b in buffers)


def ray_wire(creator, per_worker: int, steps: int) -> tuple[float, float]:
    """Median request and reply bytes of one Ray worker per step (the actor class run in this process)."""
    from packrl.vector.ray_backend import RayWorker

    worker = RayWorker(0, 0, per_worker, creator)
    worker.start()
    worker.reset(0)
    rng = np.random.default_rng(0)
    n = worker.envs[0].single_action_space.n
    requests, replies = [], []
    for _ in range(steps):
        actions = {name: rng.integers(0, n, per_worker) for name in worker.actions}
        requests.append(pickled_bytes(actions))
        replies.append(pickled_bytes(worker.step(actions)))
    worker.close()
    return statistics.median(requests), statistics.median(replies)


def make(backend: str, creator, n: int, workers: int):
    if backend == "serial":
        return vector.make(creator, n)
    if backend == "multiprocessing":
        return vector.make(creator, n, backend="multiprocessing", num_workers=workers, main_envs=0, context="fork")
    return vector.make(creator, n, backend="ray", num_workers=workers)


def timed(backend: str, creator, n: int, workers: int, seconds: float, repeats: int) -> dict:
    """Agent-steps/s per run, and the main process's CPU seconds per step."""
    venv = make(backend, creator, n, workers)
    venv.reset(seed=0)
    actions = np.zeros(n, np.int64)
    for _ in range(20):
        venv.step(actions)
    rates, cpu = [], []
    for _ in range(repeats):
        steps, start, cpu0 = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - start < seconds:
            for _ in range(10):
                venv.step(actions)
            steps += 10
        rates.append(steps * n / (time.perf_counter() - start))
        cpu.append((time.process_time() - cpu0) / steps)
    venv.close()
    return {"rates": rates, "cpu_per_step": statistics.median(cpu)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--wire-steps", type=int, default=400)
    parser.add_argument("--node-cores", type=int, default=32)
    parser.add_argument("--envs-per-actor", type=int, default=64)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--nic-gbps", type=float, default=25.0)
    parser.add_argument("--rtt-us", type=float, default=100.0)
    args = parser.parse_args()
    n, workers = args.envs, args.workers
    per_worker = n // workers
    print(machine_line(("ray",)))
    print("Machine shared with other jobs: compare ratios within one run, not absolute numbers across runs.")
    tic = time.perf_counter()
    import ray

    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    print(f"ray.init: {time.perf_counter() - tic:.1f} s; {n} envs, {workers} workers ({per_worker} envs each); "
          f"median of {args.repeats} x {args.seconds:g} s")
    print(f"{'env':17} {'backend':16} {'agent-steps/s':>13} {'min..max':>17} {'us/step':>8} {'x serial':>8} "
          f"{'round trips/step':>16} {'bytes out/step':>14} {'bytes in/step':>13} {'main CPU us/reply':>17}")
    measured = {}
    for env_name, creator in ENVS.items():
        request, reply = ray_wire(creator, per_worker, args.wire_steps)
        results = {b: timed(b, creator, n, workers, args.seconds, args.repeats) for b in BACKENDS}
        serial = statistics.median(results["serial"]["rates"])
        for backend, r in results.items():
            med = statistics.median(r["rates"])
            trips = {"serial": 0, "multiprocessing": workers, "ray": workers}[backend]
            out_bytes, in_bytes = {"serial": (0, 0), "multiprocessing": (0, 0),
                                   "ray": (request * workers, reply * workers)}[backend]
            per_reply = f"{r['cpu_per_step'] / workers * 1e6:.0f}" if trips else "-"
            print(f"{env_name:17} {backend:16} {med:>13,.0f} {min(r['rates']):>8,.0f}..{max(r['rates']):<8,.0f} "
                  f"{n / med * 1e6:>8.0f} {med / serial:>8.2f} {trips:>16} {out_bytes:>14,.0f} {in_bytes:>13,.0f} "
                  f"{per_reply:>17}", flush=True)
        measured[env_name] = {"t_env": 1 / serial, "c": results["ray"]["cpu_per_step"] / workers,
                              "bytes": (request + reply) / per_worker}
        print(f"{env_name}: per Ray worker and step {request:,.0f} B out (actions) + {reply:,.0f} B back "
              f"= {(request + reply) / per_worker:,.0f} B per env step; multiprocessing pipes carry infos only "
              "(none here)")
    ray.shutdown()
    estimate(measured, args)


def estimate(measured: dict, args: argparse.Namespace) -> None:
    """Agent-steps/s of N env machines feeding ``args.ranks`` learner ranks (see the module docstring)."""
    E, M = args.envs_per_actor, args.ranks
    nic = args.nic_gbps * 1e9 / 8
    rtt = args.rtt_us * 1e-6
    print(f"\nEstimate: {args.node_cores} actors per env machine, {E} envs per actor, {M} learner ranks on one "
          f"machine with {args.nic_gbps:g} Gb/s, {args.rtt_us:g} us round trip (assumed); t_env, c and bytes "
          "as measured above")
    print(f"{'env':17} {'nodes':>5} {'actors/rank':>11} {'env part ms':>11} {'learner part ms':>15} "
          f"{'steps/s (CPU)':>13} {'network cap':>11} {'estimate':>10}  limited by")
    for env_name, m in measured.items():
        for nodes in (4, 16, 64):
            A = nodes * args.node_cores / M
            env_part, learner_part = E * m["t_env"] + rtt, A * m["c"]
            cpu_rate = M * A * E / (env_part + learner_part)
            cap = nic / m["bytes"]
            rate = min(cpu_rate, cap)
            limit = ("the learner's network" if cap < cpu_rate else
                     "the learners' CPU per reply" if learner_part > env_part else "the envs' CPU")
            print(f"{env_name:17} {nodes:>5} {A:>11.0f} {env_part * 1e3:>11.1f} {learner_part * 1e3:>15.1f} "
                  f"{cpu_rate:>13,.0f} {cap:>11,.0f} {rate:>10,.0f}  {limit}")


if __name__ == "__main__":
    main()

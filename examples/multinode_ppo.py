"""PPO with env workers as Ray actors on many machines and learners under torchrun on many GPUs.

Every torchrun rank is one learner: it joins the process group (NCCL on GPUs, gloo on CPU), connects to
the Ray cluster as a driver, and makes its own ``vector.make(..., backend="ray")`` of ``--num-envs`` envs on
``--num-workers`` actors, which Ray places on the machines that offer the ``--actor-resource`` (each actor
asks for one unit, so ``ray start --resources='{"envs": 16}'`` on a machine lets 16 actors run there).
``packrl.train.PPO`` then steps its envs, and averages gradients across ranks before each optimizer step
(rank r's envs are seeded apart from every other rank's). Rank 0 prints one line per iteration. The
README's "Multi-node" section has the commands; ``--ray-address`` is the head's ``host:port``.

    torchrun --nproc-per-node 2 examples/multinode_ppo.py --ray-address HEAD:6379 --total-steps 200000
    .venv/bin/python examples/multinode_ppo.py --backend serial          # one process, no Ray, no torchrun
"""
from __future__ import annotations

import argparse
import math
import os

import gymnasium
import torch
import torch.distributed as dist

from packrl import vector
from packrl.models import Policy
from packrl.train.ppo import PPO, PPOConfig


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="CartPole-v1", help="a gymnasium id (each actor makes its envs)")
    parser.add_argument("--backend", default="ray", choices=["ray", "multiprocessing", "serial"])
    parser.add_argument("--ray-address", default=None, help="the Ray head's host:port (default: RAY_ADDRESS, "
                        "else a local cluster of this machine)")
    parser.add_argument("--num-envs", type=int, default=16, help="envs per rank")
    parser.add_argument("--num-workers", type=int, default=4, help="Ray actors (or processes) per rank")
    parser.add_argument("--actor-resource", default=None, help="a custom Ray resource each actor asks one unit "
                        "of (e.g. envs), so actors run only on the machines started with it")
    parser.add_argument("--total-steps", type=int, default=100_000, help="agent steps, all ranks together")
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    if world > 1:  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
        if cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    device = f"cuda:{local_rank}" if cuda else "cpu"

    options: dict = {}
    if args.backend == "ray":
        import ray

        address = args.ray_address or os.environ.get("RAY_ADDRESS")
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        actor_options = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
        if args.actor_resource:
            actor_options["resources"] = {args.actor_resource: 1}
        options = {"num_workers": args.num_workers, "actor_options": actor_options}
    elif args.backend == "multiprocessing":
        options = {"num_workers": args.num_workers}
    env_id = args.env_id
    venv = vector.make(lambda: gymnasium.make(env_id), args.num_envs, backend=args.backend, seed=args.seed, **options)
    if args.backend == "ray":
        print(f"rank {rank}: {args.num_workers} actors on nodes {sorted(set(venv.worker_nodes))}, pids "
              f"{venv.worker_pids}", flush=True)

    policy = Policy.from_env(venv, hidden=64)
    ppo = PPO(venv, policy, PPOConfig(num_steps=args.num_steps, seed=args.seed, device=device))

    def report(stats: dict) -> None:
        losses = {k: float(stats[k]) for k in ("pg_loss", "v_loss") if k in stats}
        if not all(math.isfinite(v) for v in losses.values()):
            raise RuntimeError(f"rank {rank}, iteration {stats['iteration']}: a loss is not finite: {losses}")
        if rank == 0:
            shown = " ".join(f"{k}={v:.4f}" for k, v in losses.items())
            ret = f" episode_return={stats['episode_return']:.1f}" if "episode_return" in stats else ""
            print(f"iteration={stats['iteration']} global_step={stats['global_step']} {shown}{ret} "
                  f"sps={stats['sps']:.0f}", flush=True)

    ppo.train(args.total_steps, report)
    venv.close()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Training on a CUDA device (every test skips without one): FlatAdam's buffers on the device, the CartPole
preset learning on CUDA with its checkpoint played on CPU, bf16 with torch.compile and the separate critic,
and the same seed giving the same checkpoint."""
import copy
import json

import numpy as np
import pytest
import torch
from torch import nn

from packrl.checkpoint import sha256_file
from packrl.cli import main
from packrl.train.evaluate import evaluate
from packrl.train.optimizer import FlatAdam, adam
from packrl.train.run import load_policy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _train(out, *args: str) -> int:
    return main(["train", *args, "--device", "cuda", "--no-live", "--checkpoint-minutes", "0", "--out", str(out)])


def _history(run) -> list[dict]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines() if line.strip()]


def test_flat_adam_on_cuda_follows_torch_adam_through_clipping():
    torch.manual_seed(0)
    ours = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 3)).cuda()
    ref = copy.deepcopy(ours)
    flat = adam(ours.parameters(), 1e-2)
    assert isinstance(flat, FlatAdam) and flat.flat.is_cuda and flat.grad.is_cuda
    torch_adam = torch.optim.Adam(ref.parameters(), lr=1e-2, eps=1e-5)
    for _ in range(5):
        x = torch.randn(64, 4, device="cuda")
        for net, opt in ((ours, flat), (ref, torch_adam)):
            opt.zero_grad()
            ((net(x) ** 2).sum() * 50).backward()  # large gradients, so clipping acts
        torch.testing.assert_close(flat.clip_grad_norm(0.5), nn.utils.clip_grad_norm_(ref.parameters(), 0.5))
        flat.step()
        torch_adam.step()
    for p, q in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert all(p.is_cuda for p in ours.parameters())


def test_the_cartpole_preset_learns_on_cuda_and_its_checkpoint_plays_on_cpu(tmp_path):
    """The preset's 100k-step budget (tests/test_learning_defaults.py runs it on CPU): a 20-episode greedy
    evaluation of the saved policy, rebuilt on CPU, must reach the 475 threshold."""
    run = tmp_path / "run"
    assert _train(run, "CartPole-v1", "--seed", "0", "--total-steps", "100000") == 0
    policy, metadata, env = load_policy(run / "checkpoint", "cpu", num_envs=20, seed=10_000)
    try:
        returns = evaluate(policy, env, episodes=20)
    finally:
        env.close()
    assert metadata["config"]["train"]["device"] == "cuda"
    assert np.mean(returns) >= 475.0, f"greedy mean {np.mean(returns):.1f} after 100k steps on CUDA"


def test_bf16_compile_and_the_separate_critic_train_on_cuda(tmp_path):
    run = tmp_path / "run"
    assert _train(run, "CartPole-v1", "--seed", "1", "--total-steps", "8192", "--train.bf16", "true",
                  "--train.compile", "true", "--policy.critic", "separate") == 0
    history = _history(run)
    assert len(history) >= 8
    for key in ("pg_loss", "v_loss", "entropy", "grad_norm"):
        assert all(np.isfinite(h[key]) for h in history), key
    assert history[-1]["learning_rate"] < history[0]["learning_rate"]  # the preset's annealing ran


def test_same_seed_gives_the_same_checkpoint_on_cuda(tmp_path):
    args = ["gridworld", "--num-envs", "8", "--total-steps", "2048", "--train.num_steps", "64", "--hidden", "32"]
    for name, seed in (("a", "5"), ("b", "5"), ("c", "6")):
        assert _train(tmp_path / name, *args, "--seed", seed) == 0
    a, b, c = (sha256_file(tmp_path / n / "checkpoint" / "model.safetensors") for n in "abc")
    assert a == b
    assert a != c


@pytest.mark.parametrize("network,env_id", [("mlp", "gridworld"), ("lstm", "gridworld"), ("mlp", "cartpole")])
def test_rollout_as_cuda_graphs_stores_what_the_eager_rollout_stores(network, env_id):
    """The rollout's steps replayed as captured CUDA graphs (``cuda_graphs``) fill storage exactly as the eager
    steps do, over two rollouts with an update between them (the graphs read the updated weights in place) and
    episode ends inside them; the staged env arrays, final values and next values included."""
    from packrl import vector
    from packrl.models import Policy
    from packrl.train.ppo import PPO, PPOConfig

    def run(graphs: bool) -> PPO:
        env = vector.make(env_id, 64, backend="numba", seed=0)
        torch.manual_seed(0)
        ppo = PPO(env, Policy.from_env(env, network=network, hidden=32),
                  PPOConfig(num_steps=32, device="cuda", cuda_graphs=graphs, seed=0))
        ppo.collect()
        ppo.update()
        ppo.collect()
        assert ppo.graphs.captured == graphs
        return ppo

    a, b = run(False), run(True)
    assert a.truncations.any() or a.terminals.any()
    for name in ("obs", "masks", "starts", "rewards", "terminals", "truncations", "actions", "logprobs", "values",
                 "final_values", "next_value"):
        torch.testing.assert_close(getattr(b, name), getattr(a, name), msg=name)


def test_ops_per_rollout_step_on_cuda_are_graph_replays():
    """With CUDA graphs a rollout step launches a handful of device calls, not one per op: at most 8 launches
    (graph, observation copy in, action copy out, ...) per step under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    from packrl import vector
    from packrl.models import Policy
    from packrl.train.ppo import PPO, PPOConfig

    env = vector.make("gridworld", 256, backend="numba", seed=0)
    ppo = PPO(env, Policy.from_env(env, hidden=64), PPOConfig(num_steps=32, device="cuda", cuda_graphs=True))
    ppo.collect()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        ppo.collect()
        torch.cuda.synchronize()
    counts = {e.key: e.count for e in prof.key_averages()}
    launches = sum(counts.get(k, 0) for k in ("cudaLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync",
                                              "cuLaunchKernel", "cudaLaunchKernelExC"))
    assert counts.get("cudaGraphLaunch", 0) >= 32
    assert launches / 32 <= 8, counts

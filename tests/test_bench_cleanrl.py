"""The CleanRL-style PPO file of benchmarks/train.py as benchmarks/learning.py runs it (issue 21's CleanRL column):
whole iterations, a callback per iteration with that rollout's finished CartPole returns, same seed same run,
and the greedy evaluation. Bounded by steps; learning.py measures time to threshold."""
import pytest
import torch

from tests.benchmark_modules import load_benchmark


@pytest.fixture(scope="module")
def learning():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as learning.py runs every contender; tiny batches on 2 busy cores crawl with more
    yield load_benchmark("learning")
    torch.set_num_threads(threads)


def _run(learning, seed: int, budget: int = 2000):
    calls = []
    agent, steps, seconds = learning.cleanrl_ppo(budget, seed, learning.ZOO_CARTPOLE,
                                                 lambda step, returns: calls.append((step, list(returns))))
    return agent, steps, seconds, calls


def test_zoo_args_run_whole_iterations_and_report_each_one(learning):
    args = learning.ZOO_CARTPOLE
    batch = args.num_envs * args.num_steps
    assert batch == 256 and args.num_minibatches == 1  # rl-zoo's CartPole: 8 envs x 32 steps, one batch of 256
    _, steps, seconds, calls = _run(learning, seed=0)
    assert steps == 2000 // batch * batch == 1792
    assert [step for step, _ in calls] == [batch * i for i in range(1, 8)]
    returns = [r for _, rs in calls for r in rs]
    assert len(returns) >= 20  # an untrained policy ends CartPole episodes within a few dozen steps
    # CartPole pays 1 a step, so an episode's return is its length: whole steps, and together no more than taken
    assert all(r == int(r) and 8 <= r <= 500 for r in returns)
    assert sum(returns) <= steps and seconds > 0


def test_same_seed_same_run_and_another_seed_another(learning):
    first, second, other = (_run(learning, seed, budget=768) for seed in (3, 3, 4))
    assert first[3] == second[3]
    assert first[3] != other[3]
    for a, b in zip(first[0].state_dict().values(), second[0].state_dict().values()):
        assert (a == b).all()


def test_greedy_eval_plays_whole_episodes_seeded(learning):
    agent = _run(learning, seed=0, budget=256)[0]
    returns = learning.greedy_returns(agent, 5, seed=10_000)
    assert len(returns) == 5 and all(8 <= r <= 500 for r in returns)
    assert returns == learning.greedy_returns(agent, 5, seed=10_000)

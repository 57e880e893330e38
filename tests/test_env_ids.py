"""Env ids as users write them: packrl envs, gymnasium ids, module:EnvId, MiniGrid/BabyAI ids without an import,
PettingZoo module paths, module:function from the current folder; close matches for unknown ids; what
allow_code=False refuses; vector.make given an id or an env instance."""
import sys

import gymnasium as gym
import numpy as np
import pytest

from packrl import ConfigError, EmulationError, PackrlError, UsageError, env_ids, vector
from packrl.checkpoint import read_metadata
from packrl.cli import main
from packrl.train.run import env_creator


def test_each_form_resolves_to_its_kind():
    from pettingzoo.utils.env import AECEnv, ParallelEnv

    assert env_creator("gridworld")[1] == "numba"
    creator, backend = env_creator("CartPole-v1")
    assert backend == "serial" and creator().spec.id == "CartPole-v1"
    assert isinstance(env_creator("pettingzoo.classic.connect_four_v3")[0](), AECEnv)
    assert isinstance(env_creator("pettingzoo.butterfly.knights_archers_zombies_v11")[0](), ParallelEnv)
    assert isinstance(env_creator("pettingzoo.butterfly.knights_archers_zombies_v11", api="aec")[0](), AECEnv)
    for env_id in ("MiniGrid-Empty-5x5-v0", "minigrid:MiniGrid-Empty-5x5-v0", "BabyAI-GoToLocal-v0"):
        env = env_creator(env_id)[0]()
        assert env.spec.id == env_id.rpartition(":")[2] and "mission" in env.observation_space.spaces
    assert env_creator("MiniGrid-Empty-5x5-v0", {"max_steps": 7})[0]().unwrapped.max_steps == 7


def test_module_function_is_found_in_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "my_envs_for_packrl.py").write_text(
        "import gymnasium\n\ndef make(size=3):\n    return gymnasium.make('CartPole-v1', max_episode_steps=size)\n\n"
        "NOT_A_FUNCTION = 3\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        creator, backend = env_creator("my_envs_for_packrl:make", {"size": 5})
        assert backend == "serial" and creator().spec.max_episode_steps == 5
        with pytest.raises(ConfigError, match="my_envs_for_packrl.NOT_A_FUNCTION is a int, not a function"):
            env_creator("my_envs_for_packrl:NOT_A_FUNCTION")
        with pytest.raises(ConfigError, match="has no attribute 'mkae'.*did you mean make"):
            env_creator("my_envs_for_packrl:mkae")
    finally:
        sys.modules.pop("my_envs_for_packrl", None)


def test_unknown_ids_get_close_matches():
    for env_id, close in (("CartPol-v1", "CartPole-v1"), ("MiniGrid-Empty-5x5", "MiniGrid-Empty-5x5-v0"),
                          ("gridwrold", "gridworld"), ("cartpole-v1", "CartPole-v1")):
        with pytest.raises(ConfigError, match=f"unknown env '{env_id}' \\(did you mean {close}"):
            env_creator(env_id)
    with pytest.raises(ConfigError, match="unknown env 'NoSuchEnv-v0': not a packrl env"):
        env_creator("NoSuchEnv-v0")
    with pytest.raises(ConfigError, match="MiniGrid-Nope-v0"):  # a known namespace, an id it does not have
        env_creator("MiniGrid-Nope-v0")
    with pytest.raises(ConfigError, match="did you mean pettingzoo.classic.tictactoe_v3"):
        env_creator("pettingzoo.classic.tictactoe_v2")
    with pytest.raises(ConfigError, match="cannot import 'no_such_module_xyz': no such module"):
        env_creator("no_such_module_xyz:make")


def test_a_namespace_whose_package_is_missing_says_what_to_install(monkeypatch):
    monkeypatch.setitem(env_ids.NAMESPACES, "Fake-", ("packrl_no_such_package", "packrl-no-such-package"))
    with pytest.raises(ConfigError, match="registered by the 'packrl-no-such-package' package, which is not "
                                          "installed .*: pip install packrl-no-such-package"):
        env_creator("Fake-Thing-v0")


def test_ids_read_from_files_never_choose_code():
    for env_id in ("tests.test_cli:nan_reward_env", "tests.test_env_ids:make_cartpole", "gymnasium:CartPole-v1"):
        with pytest.raises(ConfigError, match="names code to import"):
            env_creator(env_id, allow_code=False)
    for env_id in ("pettingzoo..classic.chess_v6", "pettingzoo.classic.chess_v6; import os"):
        with pytest.raises(ConfigError, match="not a module path"):
            env_creator(env_id, allow_code=False)
    # the fixed packages packrl knows stay allowed
    assert env_creator("MiniGrid-Empty-5x5-v0", allow_code=False)[0]().spec.id == "MiniGrid-Empty-5x5-v0"
    assert env_creator("minigrid:MiniGrid-Empty-5x5-v0", allow_code=False)[0]().spec.id == "MiniGrid-Empty-5x5-v0"
    with pytest.raises(ConfigError, match="registers no gymnasium id 'make'"):
        env_creator("minigrid:make", allow_code=False)


def make_cartpole():
    return gym.make("CartPole-v1")


def test_a_namespaced_id_works_in_a_fresh_worker_process():
    """A spawned worker has not imported minigrid: the creator imports it before gymnasium.make."""
    creator, _ = env_creator("MiniGrid-Empty-5x5-v0")
    venv = vector.make(creator, 2, backend="multiprocessing", num_workers=1, main_envs=0, context="spawn")
    try:
        obs, _ = venv.reset(seed=0)
        obs, rewards, terminals, truncations, _ = venv.step(np.array([2, 2]))
        assert obs.shape[0] == 2 and obs.dtype == np.uint8
    finally:
        venv.close()


@pytest.mark.parametrize("env_id", ["MiniGrid-Empty-5x5-v0", "minigrid:MiniGrid-Empty-5x5-v0", "BabyAI-GoToLocal-v0"])
def test_minigrid_and_babyai_start_training(env_id, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", env_id, "--total-steps", "128", "--num-envs", "2", "--train.num_steps", "32", "--no-live",
               "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    meta = read_metadata(out / "checkpoint")
    assert meta["env_id"] == env_id and meta["global_step"] == 128
    preset, learning_rate = ("babyai", 1e-3) if env_id.startswith("BabyAI") else ("minigrid", 2e-3)
    assert meta["config"]["train"]["learning_rate"] == learning_rate  # the env id's preset
    assert f"preset: {preset}" in capsys.readouterr().out


def test_vector_make_says_what_it_takes():
    with pytest.raises(UsageError, match=r"not the string 'CartPole-v1'; pass lambda: gymnasium.make\('CartPole-v1'\)"):
        vector.make("CartPole-v1", 2)
    with pytest.raises(UsageError, match="backend='numba' for the packrl env 'gridworld'"):
        vector.make("gridworld", 2)
    env = gym.make("CartPole-v1")
    with pytest.raises(UsageError, match="not an env instance .*TimeLimit"):
        vector.make(env, 2)
    with pytest.raises(UsageError, match="got builtins.int"):
        vector.make(3, 2)
    # what was caught before still catches: the TypeError of calling a string, a PackrlError, a ValueError
    for kind in (TypeError, ValueError, PackrlError):
        with pytest.raises(kind):
            vector.make("CartPole-v1", 2)
    with pytest.raises(UsageError, match="unknown backend") as info:
        vector.make(make_cartpole, 2, backend="threads")
    assert not isinstance(info.value, EmulationError)  # misuse is not a sample that does not fit its space
    assert vector.make("gridworld", 2, backend="numba").num_envs == 2

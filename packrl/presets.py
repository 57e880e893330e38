"""Settings per env family, chosen from the env id: ``packrl train CartPole-v1`` trains with rl-zoo's tuned
CartPole PPO, not with settings made for Atari.

A preset sits between the defaults and the user's own settings:
``defaults < preset < config file < flags``. ``packrl configs`` lists the presets and what each sets,
``packrl configs NAME`` prints one as a TOML config file, ``packrl train ENV --preset none`` trains with the
plain defaults, and ``--preset NAME`` picks one by hand. Each preset says where its numbers come from.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from packrl.errors import ConfigError


@dataclass(frozen=True)
class Preset:
    """Settings (``{section: {key: value}}``) for the env ids that match one of ``patterns`` (fnmatch)."""

    name: str
    summary: str
    source: str
    patterns: tuple[str, ...]
    settings: dict = field(default_factory=dict)

    def matches(self, env_id: str) -> bool:
        """Whether this preset is the one for ``env_id`` (``module:EnvId`` is matched by its EnvId)."""
        name = env_id.rpartition(":")[2]
        return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(env_id, p) for p in self.patterns)

    def items(self) -> list[tuple[str, object]]:
        """``[("vec.num_envs", 8), ...]`` in section order."""
        return [(f"{section}.{key}", value) for section, values in self.settings.items() for key, value in values.items()]

    def to_toml(self) -> str:
        """The preset as a config file (``packrl configs NAME > my.toml``)."""
        lines = [f"# preset {self.name}: {self.summary}", f"# source: {self.source}"]
        for section, values in self.settings.items():
            lines.append(f"\n[{section}]")
            lines += [f"{key} = {_toml(value)}" for key, value in values.items()]
        return "\n".join(lines) + "\n"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, dict):  # an inline table, keys quoted ('mission/chars' is no bare key)
        return "{" + ", ".join(f"{_toml(str(k))} = {_toml(v)}" for k, v in value.items()) + "}"
    return repr(value)


_MINIGRID_PPO = {"num_steps": 128, "learning_rate": 1e-3, "anneal_lr": False, "update_epochs": 4, "num_minibatches": 8,
                 "gamma": 0.99, "gae_lambda": 0.95, "clip_coef": 0.2, "ent_coef": 0.01, "vf_coef": 1.0,
                 "max_grad_norm": 0.5}

# rl-baselines3-zoo hyperparams/ppo.yml, Acrobot-v1 (MountainCar-v0 has the same but n_steps 16, gae_lambda 0.98)
_ZOO_ACROBOT = {"num_steps": 256, "num_minibatches": 64, "update_epochs": 4, "gamma": 0.99, "gae_lambda": 0.94,
                "learning_rate": 3e-4, "anneal_lr": False, "ent_coef": 0.0, "clip_coef": 0.2, "clip_vloss": False,
                "vf_coef": 0.5, "max_grad_norm": 0.5, "normalize_rewards": True}

PRESETS: tuple[Preset, ...] = (
    Preset(
        "gridworld",
        "packrl's Numba gridworld: the settings of examples/train_demo.py, which reach the 0.8 pass mark",
        "examples/train_demo.py (hand-picked; measured to learn, see tests/test_learning.py)",
        ("gridworld",),
        {"vec": {"backend": "numba", "num_envs": 32},
         "policy": {"network": "mlp", "hidden": 64},
         "train": {"num_steps": 32, "learning_rate": 2e-3, "ent_coef": 0.01, "update_epochs": 4,
                   "num_minibatches": 4, "gamma": 0.95}},
    ),
    Preset(
        "classic-control",
        "CartPole (gymnasium CartPole-v0/v1 and packrl's Numba cartpole): rl-zoo's tuned PPO",
        "rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1: n_envs 8, n_steps 32, batch_size 256 "
        "(8 * 32 / 256 = 1 minibatch), gae_lambda 0.8, gamma 0.98, n_epochs 20, ent_coef 0.0, "
        "learning_rate lin_1e-3 (annealed), clip_range lin_0.2 (packrl keeps 0.2 fixed), no value clipping "
        "(SB3's clip_range_vf=None), SB3's 64-unit MlpPolicy with its separate actor and critic networks "
        "(policy.critic = separate). benchmarks/learning.py, Numba cartpole, seeds 0-4: the separate critic met 475 "
        "at 32k-48k agent steps (median 34k) and stayed at 500; the shared trunk at 37k-77k, one seed not within "
        "100k and one falling back to 214 after it",
        ("CartPole-v0", "CartPole-v1", "cartpole"),
        {"vec": {"num_envs": 8},
         "policy": {"hidden": 64, "critic": "separate"},
         "train": {"num_steps": 32, "num_minibatches": 1, "gae_lambda": 0.8, "gamma": 0.98, "update_epochs": 20,
                   "ent_coef": 0.0, "learning_rate": 1e-3, "anneal_lr": True, "clip_coef": 0.2,
                   "clip_vloss": False}},
    ),
    Preset(
        "minigrid-memory",
        "MiniGrid tasks that need memory (RedBlueDoors, Memory): the minigrid preset with an LSTM core",
        "rl-starter-files' README trains MiniGrid-RedBlueDoors-6x6-v0 with --recurrence 4 (its LSTM memory, 4 steps "
        "of backpropagation through time); the rest as the minigrid preset. benchmarks/learning_minigrid.py: "
        "RedBlueDoors-6x6 met a moving mean of 0.9 at 911k, 281k and 582k frames (seeds 0-2; torch-ac with "
        "rl-starter-files' settings, seed 0: 391k)",
        ("MiniGrid-RedBlueDoors-*", "MiniGrid-MemoryS*"),
        {"vec": {"num_envs": 16},
         "policy": {"network": "lstm", "overrides": {"image": "cells"}},
         "train": {**_MINIGRID_PPO, "bptt_horizon": 4}},
    ),
    Preset(
        "babyai",
        "BabyAI levels (image, direction and mission): rl-starter-files' PPO as it is; the image as cell codes, "
        "steered by the mission's words",
        "rl-starter-files (torch-ac) PPO defaults, as the minigrid preset had them before issue 30 (see it for each "
        "value). Kept apart from it because the minigrid preset's gae_lambda 0.99, lr 2e-3 and separate critic, "
        "which DoorKey-6x6 needed, slowed BabyAI-GoToRedBallGrey-v0 (benchmarks/learning_minigrid.py, moving mean "
        "of 100 episodes, seeds 0 and 1): these settings met 0.9 at 116,736 and 106,496 frames, those stood at "
        "0.891 and 0.864 after 151k",
        ("BabyAI-*",),
        {"vec": {"num_envs": 16},
         "policy": {"overrides": {"image": "cells"}},
         "train": dict(_MINIGRID_PPO)},
    ),
    Preset(
        "minigrid",
        "MiniGrid (image, direction and mission): rl-starter-files' PPO with gae_lambda 0.99, lr 2e-3 and a "
        "separate critic; the image as cell codes, steered by the mission's words",
        "rl-starter-files (torch-ac) PPO defaults: 16 processes, 128 frames per process, lr 1e-3 (constant), "
        "4 epochs, batch 256 (16 * 128 / 256 = 8 minibatches), discount 0.99, gae_lambda 0.95, clip 0.2, "
        "entropy 0.01, value loss 0.5 * MSE (torch-ac's value_loss_coef 0.5 on the squared error: packrl's "
        "vf_coef 1.0, as packrl's value loss is 0.5 * MSE), max grad norm 0.5. The image leaf is read as codes "
        "(the 'cells' encoder), the mission as words. benchmarks/learning_minigrid.py, DoorKey-5x5 frames to a "
        "moving mean of 0.9: vf_coef 0.5 took 63k (seed 0) and 59k (seed 1), 1.0 took 47k and 39k (seed 2: "
        "51k); GoToDoor-5x5 with its mission: 119k-227k frames (seeds 0-2). Changed for issue 30 "
        "(benchmarks/minigrid_stability.py, DoorKey-6x6, 100k frames, seeds 0-2, frames to a 5-iteration training "
        "mean of 0.9): with the settings above 1 of 3 seeds (69,632; seeds 1 and 2 never learned), its misses "
        "runs whose few early successes faded; gae_lambda 0.99, learning rate 2e-3 and a separate critic "
        "(policy.critic = separate: the critic's own encoder and MLP) met it on 3 of 3 (98,304, 71,680, 90,112; "
        "seed 3: 0.85 at 100k); without the separate critic seed 0 missed, without lr 2e-3 or lambda 0.99 two "
        "seeds did. MiniGrid-Fetch-5x5-N2 (its target named only in the mission) reaches 0.9 since the mission "
        "steers the grid encoder (FiLM, packrl.models.encoders)",
        ("MiniGrid-*",),
        {"vec": {"num_envs": 16},
         "policy": {"critic": "separate", "overrides": {"image": "cells"}},
         "train": {**_MINIGRID_PPO, "gae_lambda": 0.99, "learning_rate": 2e-3}},
    ),
    Preset(
        "pettingzoo-classic",
        "PettingZoo classic two-player, turn-based, masked games (tictactoe, connect four, ...)",
        "no published PPO setting: issue 21's measurement (tictactoe against a random opponent: learning rate "
        "1e-3 won 0.785 after 800k steps where the defaults won 0.585 after 200k); entropy 0.05 from "
        "benchmarks/README.md (tictactoe self-play, 200k agent steps, seeds 0-2: greedy win+draw against a random "
        "legal opponent 0.98, 0.975, 0.985; entropy 0.01: 0.67 on seed 0); connect four with the same settings, "
        "self-play, 350k agent steps, seeds 0-2: greedy win against a random legal opponent >= 0.9 first at 50k, "
        "200k and 50k steps; 0.91, 0.915, 0.895 at 350k; between checks self-play swings 0.76-0.96 "
        "(benchmarks/README.md)",
        ("pettingzoo.classic.*", "connect_four"),
        {"train": {"learning_rate": 1e-3, "ent_coef": 0.05}},
    ),
    Preset(
        "simple-spread",
        "MPE's simple_spread and simple_tag (packrl's Numba ports and mpe2's): settings found by packrl sweep",
        "packrl sweep simple_spread --trials 60 --budget 65536 --jobs 2 (TPE over the default ranges plus "
        "normalize_rewards, hidden, critic, activation and more minibatch counts; 2026-12-05), its best trial "
        "rounded: 32 steps, 2 minibatches, 16 epochs, lr 1.5e-3 annealed, gamma 0.98, gae_lambda 0.85, clip 0.25, "
        "entropy 0.01, reward scaling, a separate critic of 64 relu units. The parallel-multiagent preset (MAPPO's "
        "settings) stood at -22.5 to -24.2 greedy after 65,536 agent steps (seeds 0-2), worse than SB3's -19.9; "
        "benchmarks/spread_learning.py measures these against SB3 on mpe2's own env. On simple_tag (one policy per "
        "group: predators and prey) they learned both groups in 1M agent steps, seeds 0-4, greedy on mpe2's env "
        "against a random other group: predators 9.6-22.4 (random 4.9), prey -3.3 to -9.3 (random -13.6); "
        "packrl's plain defaults and the parallel-multiagent preset left the predators at random's level or below",
        ("simple_spread", "mpe2.simple_spread_v3", "pettingzoo.mpe.simple_spread_v3", "simple_tag", "mpe2.simple_tag_v3",
         "pettingzoo.mpe.simple_tag_v3"),
        {"policy": {"hidden": 64, "critic": "separate"},
         "train": {"num_steps": 32, "learning_rate": 1.5e-3, "anneal_lr": True, "update_epochs": 16,
                   "num_minibatches": 2, "ent_coef": 0.01, "clip_coef": 0.25, "gamma": 0.98, "gae_lambda": 0.85,
                   "normalize_rewards": True}},
    ),
    Preset(
        "parallel-multiagent",
        "PettingZoo Parallel multi-agent envs (butterfly, sisl, mpe, mpe2, magent2): MAPPO's MPE settings",
        "MAPPO (Yu et al. 2022, marlbenchmark/on-policy), train_mpe_spread.sh and config.py: lr 7e-4 (constant), "
        "10 PPO epochs, 1 minibatch, episode length 25, entropy 0.01, clip 0.2, gamma 0.99, gae_lambda 0.95, "
        "hidden 64. Not taken: its 128 rollout threads (num_envs stays 8), value normalization, Huber loss and "
        "max_grad_norm 10, which packrl's value loss does not have",
        ("pettingzoo.butterfly.*", "pettingzoo.sisl.*", "pettingzoo.mpe.*", "mpe2.*", "magent2.*"),
        {"policy": {"hidden": 64},
         "train": {"num_steps": 25, "learning_rate": 7e-4, "anneal_lr": False, "update_epochs": 10,
                   "num_minibatches": 1, "ent_coef": 0.01, "clip_coef": 0.2, "gamma": 0.99, "gae_lambda": 0.95}},
    ),
    Preset(
        "pendulum",
        "Pendulum: rl-zoo's PPO with a separate critic, reward scaling and an initial log-std of -0.5",
        "rl-baselines3-zoo hyperparams/ppo.yml, Pendulum-v1: n_envs 4, n_steps 1024, batch_size 64 (4 * 1024 / 64 = "
        "64 minibatches), gae_lambda 0.95, gamma 0.9, n_epochs 10, ent_coef 0.0, learning_rate 1e-3 (annealed here, "
        "constant in the zoo), clip_range 0.2, no value clipping (SB3's clip_range_vf=None), SB3's MlpPolicy with "
        "separate actor and critic networks of 64 (policy.critic = separate). Not taken: use_sde (packrl's Box head "
        "has a state-independent log-std). Added: reward scaling (CleanRL's NormalizeReward). Measured "
        "(benchmarks/learning.py --continuous, 100k steps, seeds 0-2, 2026-12-04): log_std_init -0.5 without "
        "observation normalization met a training mean of -200 at 41k, 41k and 53k steps, greedy eval -143, -149, "
        "-156; log-std 0 with observation normalization stayed near -570 on seeds 0 and 1 (greedy -574, -565), "
        "log-std -0.5 with it on seed 2 (-525): both left out. Log-std 0 without it (the lead's runs) ended with a "
        "greedy eval of -217 to -252, worse than its sampled returns: the tanh-squashed mean under-acts",
        ("Pendulum-*",),
        {"vec": {"num_envs": 4},
         "policy": {"hidden": 64, "critic": "separate", "log_std_init": -0.5},
         "train": {"num_steps": 1024, "num_minibatches": 64, "update_epochs": 10, "gamma": 0.9, "gae_lambda": 0.95,
                   "learning_rate": 1e-3, "anneal_lr": True, "ent_coef": 0.0, "clip_coef": 0.2, "clip_vloss": False,
                   "normalize_rewards": True}},
    ),
    Preset(
        "continuous-control",
        "Box actions (MuJoCo and other continuous control): CleanRL's ppo_continuous_action settings; chosen for any "
        "gymnasium env whose action space is or holds a Box",
        "CleanRL ppo_continuous_action.py (its MuJoCo defaults): 1 env, 2048 steps, 32 minibatches, 10 epochs, "
        "learning rate 3e-4 annealed, gamma 0.99, gae_lambda 0.95, clip 0.2 with value clipping (in the scaled "
        "rewards' units), ent_coef 0.0, vf_coef 0.5, max_grad_norm 0.5, separate actor and critic of 64 units, "
        "state-independent log-std starting at 0, NormalizeObservation and NormalizeReward (both clipped at 10): "
        "policy.normalize_observations and train.normalize_rewards here; CleanRL's tanh activations "
        "(policy.activation). Measured (benchmarks/learning.py --continuous --tasks mountaincar-continuous, 100k "
        "steps, seeds 0-2, 2026-12-04): MountainCarContinuous-v0 met a moving mean of 90 at 25k-37k steps (median "
        "35k), greedy eval 93.3-96.0; with relu it settled on standing still (training mean -1.6, greedy -0.01 to "
        "-0.05) on every seed, also under CleanRL's own per-step normalization wrappers, so the activation, not the "
        "head or the normalization timing, made the difference (benchmarks/README.md, continuous control)",
        ("MountainCarContinuous-*", "LunarLanderContinuous-*", "BipedalWalker*", "HalfCheetah-*", "Hopper-*",
         "Walker2d-*", "Ant-*", "Humanoid-*", "HumanoidStandup-*", "Swimmer-*", "Reacher-*", "Pusher-*",
         "InvertedPendulum-*", "InvertedDoublePendulum-*"),
        {"vec": {"num_envs": 1},
         "policy": {"hidden": 64, "critic": "separate", "activation": "tanh", "normalize_observations": True,
                    "log_std_init": 0.0},
         "train": {"num_steps": 2048, "num_minibatches": 32, "update_epochs": 10, "learning_rate": 3e-4,
                   "anneal_lr": True, "gamma": 0.99, "gae_lambda": 0.95, "clip_coef": 0.2, "clip_vloss": True,
                   "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5, "normalize_rewards": True}},
    ),
    Preset(
        "discrete-control",
        "a flat Box observation and Discrete actions (Acrobot, MountainCar, ...): rl-zoo's Acrobot PPO with "
        "observation normalization; chosen for any gymnasium env with those spaces that no other preset names",
        "rl-baselines3-zoo hyperparams/ppo.yml, Acrobot-v1: normalize true (VecNormalize of observations and "
        "rewards: policy.normalize_observations and train.normalize_rewards here), n_envs 16, n_steps 256, "
        "batch_size 64 (16 * 256 / 64 = 64 minibatches), n_epochs 4, gamma 0.99, gae_lambda 0.94, ent_coef 0.0, "
        "learning_rate 3e-4 (constant), clip_range 0.2, no value clipping (SB3's clip_range_vf=None), SB3's "
        "MlpPolicy: separate actor and critic of 64 tanh units. Issue 42: packrl's plain defaults (8 envs, 128 "
        "steps, lr 2.5e-4 annealed, entropy 0.01, a shared relu trunk of 128, raw observations) ended Acrobot-v1 "
        "at -500 after 150k steps. Measured (benchmarks/learning.py --tasks acrobot,mountaincar, and --preset "
        "discrete-control --tasks cartpole-gym, seeds 0-2, 2026-12-05): Acrobot-v1 met a moving mean of -100 at "
        "66k-94k steps (greedy -76 to -82 at 200k); MountainCar-v0 -110 within 300k on 2 of 3 (finals -113 to "
        "-144); CartPole-v1 475 at 49k-74k, greedy 500 (benchmarks/README.md, discrete control)",
        ("Acrobot-*", "MountainCar-v*"),
        {"vec": {"num_envs": 16},
         "policy": {"hidden": 64, "critic": "separate", "activation": "tanh", "normalize_observations": True},
         "train": dict(_ZOO_ACROBOT)},
    ),
)


def names() -> list[str]:
    return [p.name for p in PRESETS]


def get(name: str) -> Preset:
    """The preset called ``name``; ConfigError (with the names) when there is none."""
    for preset in PRESETS:
        if preset.name == name:
            return preset
    raise ConfigError(f"unknown preset {name!r}; presets: {', '.join(names())} (or auto, none)")


def for_env(env_id: str) -> Preset | None:
    """The preset of ``env_id``'s family, or None (plain defaults) for an env no preset knows. An id no pattern
    matches that names a registered gymnasium env gets one by its spaces: continuous-control when its action
    space is or holds a Box, discrete-control when its observation is a flat Box and its action a Discrete."""
    preset = next((p for p in PRESETS if p.matches(env_id)), None)
    if preset is not None:
        return preset
    kinds = space_kinds(env_id)
    if kinds is None:
        return None
    if kinds.box_action:
        return get("continuous-control")
    if kinds.flat_box_observation and kinds.discrete_action:
        return get("discrete-control")
    return None


def has_box_actions(env_id: str) -> bool:
    """Whether ``env_id`` is a registered gymnasium id whose env's action space is a Box or a Dict/Tuple holding
    one (``space_kinds``)."""
    kinds = space_kinds(env_id)
    return kinds is not None and kinds.box_action


@dataclass(frozen=True)
class SpaceKinds:
    box_action: bool  # the action space is a Box or a Dict/Tuple holding one
    flat_box_observation: bool  # a Box of one dimension: a feature vector (an image Box, Atari's, is not)
    discrete_action: bool


def space_kinds(env_id: str) -> SpaceKinds | None:
    """What a preset asks of a registered gymnasium id's spaces (no ``module:`` prefix: nothing is imported for
    it), or None. The env is made and closed to read its spaces; gymnasium is imported here only, so a command
    that needs no env's spaces does not pay for it."""
    import gymnasium as gym

    if ":" in env_id or gym.registry.get(env_id) is None:
        return None
    try:
        env = gym.make(env_id)
    except Exception:  # noqa: BLE001 - an env that cannot be made here has no preset; training reports why
        return None
    try:
        observation, action = env.observation_space, env.action_space
    finally:
        env.close()

    def holds_box(space: object) -> bool:
        if isinstance(space, gym.spaces.Box):
            return True
        if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
            parts = space.spaces.values() if isinstance(space, gym.spaces.Dict) else space.spaces
            return any(holds_box(s) for s in parts)
        return False

    return SpaceKinds(holds_box(action), isinstance(observation, gym.spaces.Box) and len(observation.shape) == 1,
                      isinstance(action, gym.spaces.Discrete))


def choose(choice: str, env_id: str) -> Preset | None:
    """``--preset`` as given: ``auto`` (by env id), ``none``, or a preset name."""
    if choice == "auto":
        return for_env(env_id)
    if choice == "none":
        return None
    return get(choice)

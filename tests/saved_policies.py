"""Checkpoints the tests share, written by training's own save."""


def save_untrained_cartpole(path):
    """An untrained CartPole policy (hidden 16, Adam state) written by training's own save; returns ``path``."""
    from packrl.train.ppo import PPO
    from packrl.train.run import make_policy, make_vecenv, merge_config, ppo_config, save

    config = merge_config({"env": {"id": "CartPole-v1"}, "vec": {"num_envs": 2}, "policy": {"hidden": 16},
                           "train": {"num_steps": 8}})
    vecenv = make_vecenv(config)
    try:
        save(PPO(vecenv, make_policy(vecenv, config["policy"]), ppo_config(config)), config, path, [])
    finally:
        vecenv.close()
    return path

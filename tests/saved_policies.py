"""Checkpoints the tests share, written by training's own save."""


def save_untrained(path, env_id="CartPole-v1", hidden=16):
    """An untrained policy of ``env_id`` (with its Adam state) written by training's own save; returns ``path``."""
    from packrl.train.ppo import PPO
    from packrl.train.run import make_policy, make_vecenv, merge_config, ppo_config, save

    config = merge_config({"env": {"id": env_id}, "vec": {"num_envs": 2}, "policy": {"hidden": hidden},
                           "train": {"num_steps": 8}})
    vecenv = make_vecenv(config)
    try:
        save(PPO(vecenv, make_policy(vecenv, config["policy"]), ppo_config(config)), config, path, [])
    finally:
        vecenv.close()
    return path


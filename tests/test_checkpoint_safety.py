"""A checkpoint is data: crafted metadata (env ids, kwargs, layouts, sizes, tensor names) never imports or
calls anything, and every malformed checkpoint is a CheckpointError naming the file and the field."""
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from packrl.checkpoint import CheckpointError, load_checkpoint, manifest_sha256, read_header, read_metadata
from packrl.cli import main
from packrl.train.run import load_policy
from tests.saved_policies import save_untrained

ROOT = Path(__file__).resolve().parents[1]
EVIL_MODULE = "packrl_evil_payload"


@pytest.fixture(scope="module")
def genuine(tmp_path_factory):
    """A checkpoint written by training's own save (CartPole, hidden 16, with optimizer state)."""
    return save_untrained(tmp_path_factory.mktemp("genuine") / "checkpoint")


@pytest.fixture
def ckpt(genuine, tmp_path):
    """A fresh copy of the genuine checkpoint to edit."""
    copy = tmp_path / "ckpt"
    copy.mkdir()
    for f in genuine.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    return copy


@pytest.fixture
def evil(tmp_path, monkeypatch):
    """A module on sys.path that creates a marker file when imported, and the marker path commands touch."""
    marker = tmp_path / "PWNED"
    (tmp_path / f"{EVIL_MODULE}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"
        "def make(**kwargs):\n    Path(" + repr(str(marker)) + ").touch()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(EVIL_MODULE, None)
    yield marker
    sys.modules.pop(EVIL_MODULE, None)


def edit_metadata(path, change, rehash=True):
    """Apply ``change(metadata)`` to metadata.json; recompute the manifest hash as an attacker would."""
    file = path / "metadata.json"
    meta = json.loads(file.read_text())
    change(meta)
    if rehash:
        meta["sha256"] = manifest_sha256(meta)
    file.write_text(json.dumps(meta))
    return meta


def replace_weights(path, data):
    """Put ``data`` in place of model.safetensors, with both hashes updated to match."""
    import hashlib

    (path / "model.safetensors").write_bytes(data)
    edit_metadata(path, lambda m: m.update(weights_sha256=hashlib.sha256(data).hexdigest()))


def crafted_ids(marker):
    touch = ["touch", str(marker)]
    return [
        ("os:system", {"command": " ".join(touch)}),
        ("builtins:eval", {"source": f"open({str(marker)!r}, 'w')"}),
        ("subprocess:run", {"args": touch}),
        (f"{EVIL_MODULE}:make", {}),
        (f"{EVIL_MODULE}:Evil-v0", {}),  # gymnasium's own module:EnvId form imports the module
        ("GymV26Environment-v0", {"env_id": f"{EVIL_MODULE}:Evil-v0"}),  # a shim whose kwargs name an env
        (f"pettingzoo.classic/../../{EVIL_MODULE}", {}),
        (f"pettingzoo..{EVIL_MODULE}", {}),
        (f"../{EVIL_MODULE}", {}),
        (f"/tmp/{EVIL_MODULE}.py", {}),
    ]


def set_env(env_id, kwargs):
    def change(meta):
        meta["env_id"] = env_id
        meta["config"]["env"].update(id=env_id, kwargs=kwargs)
    return change


@pytest.mark.parametrize("index", range(10))
def test_crafted_env_ids_never_run_code(ckpt, evil, index, capsys):
    env_id, kwargs = crafted_ids(evil)[index]
    edit_metadata(ckpt, set_env(env_id, kwargs))
    with pytest.raises(CheckpointError, match=r"metadata\.json: field 'config\.env\.id'"):
        load_policy(ckpt)
    assert main(["eval", str(ckpt), "--episodes", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.env.id" in err and "Traceback" not in err
    # with --env the user's env runs; the recorded id and kwargs are never used
    assert main(["eval", str(ckpt), "--env", "CartPole-v1", "--episodes", "2"]) == 0
    assert "trained on" in capsys.readouterr().out
    assert not evil.exists() and EVIL_MODULE not in sys.modules


def test_the_cli_path_runs_nothing_in_a_fresh_process(ckpt, evil):
    """The same through the installed entry point: a fresh interpreter, the payload module on its path."""
    edit_metadata(ckpt, set_env("os:system", {"command": f"touch {evil}"}))
    env = {"PYTHONPATH": f"{ROOT}:{evil.parent}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "packrl.cli", "eval", str(ckpt), "--episodes", "1"],
                         capture_output=True, text=True, env=env, cwd=evil.parent)
    assert out.returncode == 2 and "config.env.id" in out.stderr and "Traceback" not in out.stderr
    assert not evil.exists()


def test_trust_checkpoint_runs_what_it_names(ckpt, evil):
    """The documented risk: with --trust-checkpoint a module:function id is imported and called."""
    edit_metadata(ckpt, set_env(f"{EVIL_MODULE}:make", {}))
    with pytest.raises(Exception):
        load_policy(ckpt, trust_checkpoint=True)  # make() returns None, which is no env
    assert evil.exists()


def test_recorded_kwargs_are_not_passed_to_another_env(ckpt):
    edit_metadata(ckpt, set_env("CartPole-v1", {"command": "x"}))
    with pytest.raises(CheckpointError, match="config.env.kwargs.*unexpected keyword"):
        load_policy(ckpt)
    policy, _, env = load_policy(ckpt, env="CartPole-v0")  # another id: the recorded kwargs do not follow
    env.close()
    assert policy is not None


def test_manifest_covers_metadata_and_weights_and_the_callers_hash(ckpt):
    meta = read_metadata(ckpt)
    state, _, _ = load_checkpoint(ckpt, expected_sha256=meta["sha256"])
    assert state
    with pytest.raises(CheckpointError, match="does not match the expected"):
        load_checkpoint(ckpt, expected_sha256="0" * 64)
    assert main(["eval", str(ckpt), "--episodes", "1", "--sha256", "f" * 64]) == 2
    edit_metadata(ckpt, lambda m: m.update(seed=8), rehash=False)  # any edit, even one that runs nothing
    with pytest.raises(CheckpointError, match="manifest"):
        load_checkpoint(ckpt)
    edit_metadata(ckpt, lambda m: None)  # re-hashed: the checkpoint's own hash agrees, the caller's does not
    load_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match="expected"):
        load_checkpoint(ckpt, expected_sha256=meta["sha256"])


# ---------------------------------------------------------------- malformed checkpoints


def _drop(*keys):
    def change(meta):
        node = meta
        for k in keys[:-1]:
            node = node[k]
        del node[keys[-1]]
    return change


def _set(value, *keys):
    def change(meta):
        node = meta
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return change


MALFORMED_METADATA = [
    (_drop("config"), "field 'config'"),
    (_drop("config", "policy"), "field 'config.policy'"),
    (_drop("config", "env"), "field 'config.env'"),
    (_drop("config", "env", "id"), "field 'config.env.id'"),
    (_set(10**12, "config", "policy", "hidden"), "field 'config.policy.hidden'"),
    (_set(1e12, "config", "policy", "hidden"), "field 'config.policy.hidden'"),
    (_set(-4, "config", "policy", "hidden"), "field 'config.policy.hidden'"),
    (_set("transformer", "config", "policy", "network"), "field 'config.policy.network'"),
    (_set("both", "config", "policy", "critic"), "field 'config.policy.critic'"),
    (_set({"critic": "separate", "network": "lstm", "hidden": 16}, "config", "policy"), "field 'config.policy.critic'"),
    (_set("separate", "config", "policy", "critic"), r"tensor 'network.weight' that the policy needs is missing"),
    (_set({"a": "os:system"}, "config", "policy", "overrides"), "field 'config.policy.overrides'"),
    (_set(32, "config", "policy", "hidden"), r"tensor '[\w.]+' is F32 \[\d+(, \d+)*\], the policy .* needs F32"),
    (_set("gru", "config", "policy", "network"), "tensor '[\\w.]+' that the policy needs is missing"),
    (_set("nope", "format"), "field 'format'"),
    (_set("CartPole-v0", "env_id"), "field 'env_id'"),
    (_set({"param_groups": "x"}, "optimizer"), "field 'optimizer.param_groups'"),
    (_drop("layouts", "observation"), "field 'layouts.observation' is missing"),
]


@pytest.mark.parametrize("change,message", MALFORMED_METADATA, ids=[m for _, m in MALFORMED_METADATA])
def test_malformed_metadata_is_a_checkpoint_error_naming_the_field(ckpt, change, message):
    edit_metadata(ckpt, change)
    with pytest.raises(CheckpointError, match=message) as info:
        load_policy(ckpt)
    assert str(ckpt) in str(info.value)


def test_a_layout_from_another_env_is_refused_naming_the_leaf(ckpt):
    def widen(meta):
        leaf = meta["layouts"]["observation"]["tree"]["leaf"]
        leaf["high"] = {"fill": 99.0}
    edit_metadata(ckpt, widen)
    with pytest.raises(CheckpointError, match=r"layouts.observation differs from the env's at leaf \(root\): high "
                                              r"\{\"fill\": 99.0\} in the checkpoint"):
        load_policy(ckpt)
    with pytest.raises(CheckpointError, match="layouts.observation differs"):
        load_policy(ckpt, env="CartPole-v1")  # the user's env is checked against the recorded layouts too


def test_another_envs_layout_is_refused(ckpt):
    with pytest.raises(CheckpointError, match=r"layouts.observation differs from the env's at leaf \(root\): "
                                              r"shape \[4\] in the checkpoint, \[6\] in the env"):
        load_policy(ckpt, env="Acrobot-v1")  # 6 floats where CartPole has 4


def test_a_pickle_as_weights_is_refused(ckpt):
    state, _, _ = load_checkpoint(ckpt)
    pickled = ckpt / "pickled.pt"
    torch.save(state, pickled)
    replace_weights(ckpt, pickled.read_bytes())
    pickled.unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a safetensors file"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("name", ["optimizer/../../etc/x", "optimizer/0/../x", "optimizer/x/exp_avg",
                                  "../policy.weight", "encoder/weight", "a b", "optimizer/0/"])
def test_tensor_names_are_validated(ckpt, tmp_path, name):
    state, _, _ = load_checkpoint(ckpt)
    state[name] = torch.zeros(2)
    save_file(state, str(tmp_path / "w.safetensors"))
    replace_weights(ckpt, (tmp_path / "w.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor name"):
        load_checkpoint(ckpt)


def _header(entries):
    text = json.dumps(entries).encode()
    return struct.pack("<Q", len(text)) + text


@pytest.mark.parametrize("data,message", [
    (b"\x00" * 4, "not a safetensors file"),
    (struct.pack("<Q", 1 << 40) + b"{}", "header length"),
    (_header([1, 2]), "not a JSON object"),
    (_header({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}), "outside the 0 data bytes"),
    (_header({"w": {"dtype": "F32", "shape": [10**12], "data_offsets": [0, 4]}}) + b"\0" * 4, "4 bytes for shape"),
    (_header({"w": {"dtype": "PY", "shape": [1], "data_offsets": [0, 1]}}) + b"\0", "unknown dtype"),
    (_header({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}) + b"\0" * 4, "non-negative"),
])
def test_malformed_headers_are_refused(ckpt, data, message):
    replace_weights(ckpt, data)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(ckpt)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200), cut=st.integers(0, 400))
def test_any_bytes_as_weights_load_or_raise_checkpoint_error(ckpt, data, cut):
    """Random bytes, and truncations of a genuine file: CheckpointError or a valid load, nothing else."""
    genuine = (ckpt / "model.safetensors").read_bytes() if not (ckpt / "orig").exists() else (ckpt / "orig").read_bytes()
    (ckpt / "orig").write_bytes(genuine)
    for candidate in (data, genuine[:cut] + data, _header({"w": {"dtype": "U8", "shape": [len(data)],
                                                                    "data_offsets": [0, len(data)]}}) + data):
        replace_weights(ckpt, candidate)
        try:
            read_header(ckpt / "model.safetensors")
            load_checkpoint(ckpt)
        except CheckpointError as err:
            assert "model.safetensors" in str(err)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=6)
FIELDS = [("config",), ("config", "env"), ("config", "env", "id"), ("config", "env", "kwargs"), ("config", "env", "api"),
          ("config", "policy"), ("config", "policy", "hidden"), ("config", "policy", "network"),
          ("config", "policy", "overrides"), ("layouts",), ("layouts", "observation"), ("layouts", "action"),
          ("optimizer",), ("env_id",), ("weights_sha256",)]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=JSON)
def test_any_value_in_any_field_loads_or_raises_checkpoint_error(genuine, tmp_path_factory, field, value):
    path = tmp_path_factory.mktemp("fuzz") / "c"
    path.mkdir()
    for f in genuine.iterdir():
        (path / f.name).write_bytes(f.read_bytes())
    edit_metadata(path, _set(value, *field))
    try:
        _, _, env = load_policy(path)
    except CheckpointError as err:
        assert str(path) in str(err)
    else:
        env.close()

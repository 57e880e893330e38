"""`packrl inspect`, `eval` and `train --resume` fuzzed with hostile run folders: symlinks to files outside,
JSON nested deep, huge sizes and numbers, control characters, headers that lie. Whatever the folder holds,
each command ends with an exit status and at most a line of error, never a traceback, and nothing outside
the run folder is written, deleted or followed into."""
import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packrl.checkpoint import manifest_sha256
from packrl.cli import main

FILES = ["checkpoint/metadata.json", "checkpoint/model.safetensors", "history.jsonl", "learning_curve.png",
         "checkpoints", "checkpoint", ".packrl-run"]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile") / "run"
    assert main(["train", "CartPole-v1", "--num-envs", "2", "--total-steps", "64", "--train.num_steps", "32",
                 "--hidden", "8", "--no-live", "--out", str(out), "--checkpoint-every", "32"]) == 0
    return out


def deep(depth: int, kind: str) -> str:
    return ("[" * depth + "]" * depth) if kind == "list" else ('{"a":' * depth + "1" + "}" * depth)


weird_text = st.text(st.characters(codec="utf-8", categories=("Cc", "Cf", "Zl", "Zp", "Lu", "Nd", "Po", "Cs")),
                     max_size=40) | st.sampled_from(["\x1b]0;pwned\x07", "\x1b[2J", "\u202e", "\x9b31m", "\r"])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | weird_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(weird_text, children, max_size=4),
    max_leaves=12)

metadata_edit = st.one_of(
    st.tuples(st.just("deep"), st.integers(257, 100_000), st.sampled_from(["list", "dict"]), st.booleans()),
    st.tuples(st.just("field"), weird_text, json_values, st.booleans()),
    st.tuples(st.just("huge_field"), st.integers(1 << 16, 4 << 20), st.booleans()),
    st.tuples(st.just("big_int"), st.integers(4301, 20_000)),
    st.tuples(st.just("config"), st.sampled_from(["hidden", "network", "critic", "overrides", "encoder"]), json_values,
              st.booleans()),
    st.tuples(st.just("raw"), st.binary(max_size=64)),
)
header_edit = st.one_of(
    st.tuples(st.just("deep"), st.integers(9, 100_000)),
    st.tuples(st.just("length"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("shape"), st.lists(st.integers(-(2**63), 2**63), min_size=1, max_size=4)),
    st.tuples(st.just("offsets"), st.lists(st.integers(-(2**63), 2**63), min_size=0, max_size=3)),
    st.tuples(st.just("name"), weird_text),
)
link_edit = st.tuples(st.just("link"), st.sampled_from(FILES + ["checkpoints/step-000000000032",
                                                                "history.jsonl.tmp", ".history.jsonl.tmp-1-x"]))
history_edit = st.tuples(st.just("history"), st.integers(9, 100_000), weird_text)


def _put(path: Path, data: bytes | str) -> None:
    """Write ``path`` as the attacker does, replacing (never writing through) a symlink the edits made."""
    if path.is_symlink():
        path.unlink()
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def _resign(checkpoint: Path, meta: dict) -> None:
    meta["sha256"] = manifest_sha256(meta)
    _put(checkpoint / "metadata.json", json.dumps(meta))


def apply(run: Path, victim: Path, edit: tuple) -> None:
    """Turn ``run`` hostile as ``edit`` says (the attacker may re-sign the manifest: it is no secret)."""
    kind = edit[0]
    checkpoint = run / "checkpoint"
    meta_file = checkpoint / "metadata.json"
    try:
        meta = json.loads(meta_file.read_bytes())
        if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
            raise ValueError
    except (OSError, ValueError, RecursionError):  # an earlier edit broke it already (or made it a link)
        return
    if kind == "deep":
        if len(edit) == 4:  # metadata nested deep
            _put(meta_file, meta_file.read_text()[:-1] + f', "x": {deep(edit[1], edit[2])}' + "}")
        else:  # the safetensors header nested deep
            header = ('{"__metadata__": ' + deep(edit[1], "list") + "}").encode()
            _write_weights(checkpoint, meta, header)
    elif kind == "field":
        meta[edit[1]] = edit[2]
        _resign(checkpoint, meta) if edit[3] else _put(meta_file, json.dumps(meta))
    elif kind == "huge_field":
        meta["notes"] = "\x1b[31m" * (edit[1] // 5)
        _resign(checkpoint, meta) if edit[2] else _put(meta_file, json.dumps(meta))
    elif kind == "big_int":
        _put(meta_file, meta_file.read_text()[:-1] + ', "n": ' + "9" * edit[1] + "}")
    elif kind == "config":
        meta["config"].setdefault("policy", {})[edit[1]] = edit[2]
        _resign(checkpoint, meta) if edit[3] else _put(meta_file, json.dumps(meta))
    elif kind == "raw":
        _put(meta_file, edit[1])
    elif kind == "length":
        data = (checkpoint / "model.safetensors").read_bytes()
        _write_weights(checkpoint, meta, edit[1].to_bytes(8, "little") + data[8:], raw=True)
    elif kind in ("shape", "offsets", "name"):
        data = (checkpoint / "model.safetensors").read_bytes()
        n = int.from_bytes(data[:8], "little")
        try:
            header = json.loads(data[8: 8 + n])
            name = next(k for k in header if k != "__metadata__")
        except (ValueError, RecursionError, StopIteration, TypeError):  # an earlier edit broke it already
            return
        if kind == "name":
            header[edit[1]] = header.pop(name)
        elif isinstance(header[name], dict):
            header[name]["shape" if kind == "shape" else "data_offsets"] = edit[1]
        body = json.dumps(header).encode()
        _write_weights(checkpoint, meta, body, tail=data[8 + n:])
    elif kind == "link":
        target = run / edit[1]
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(victim if "." in Path(edit[1]).name else victim.parent)
    elif kind == "history":
        history = run / "history.jsonl"
        old = b"" if history.is_symlink() or not history.is_file() else history.read_bytes()
        _put(history, old + (deep(edit[1], "list") + "\n" + json.dumps({"iteration": edit[2]}) + "\n").encode())


def _write_weights(checkpoint: Path, meta: dict, header: bytes, tail: bytes = b"", raw: bool = False) -> None:
    data = header if raw else len(header).to_bytes(8, "little") + header + tail
    _put(checkpoint / "model.safetensors", data)
    meta["weights_sha256"] = hashlib.sha256(data).hexdigest()
    _resign(checkpoint, meta)


def snapshot(root: Path, run: Path) -> dict:
    """Every path under ``root`` outside ``run``, with its bytes (files) or target (links)."""
    seen = {}
    for path in sorted(root.rglob("*")):
        if path == run or run in path.parents:
            continue
        seen[str(path)] = ("link", str(path.readlink())) if path.is_symlink() else \
            ("file", path.read_bytes()) if path.is_file() else ("dir", None)
    return seen


COMMANDS = {
    "inspect": lambda run: ["inspect", str(run)],
    "inspect-full": lambda run: ["inspect", str(run / "checkpoint"), "--full"],
    "inspect-json": lambda run: ["inspect", str(run), "--json"],
    "eval": lambda run: ["eval", str(run), "--episodes", "1", "--num-envs", "1"],
    "resume": lambda run: ["train", "--resume", str(run), "--total-steps", "96", "--no-live"],
}


@settings(max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "100")), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.one_of(metadata_edit, header_edit, link_edit, history_edit), min_size=1, max_size=3),
       command=st.sampled_from(sorted(COMMANDS)))
def test_hostile_run_folders_give_an_exit_status_never_a_traceback(base_run, edits, command):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run = root / "run"
        shutil.copytree(base_run, run, symlinks=True)
        (root / "outside").mkdir()
        victim = root / "outside" / "victim.txt"
        victim.write_text("the user's file")
        for edit in edits:
            apply(run, victim, edit)
        before = snapshot(root, run)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(COMMANDS[command](run))
            except SystemExit as exit_:  # argparse's own one-line errors
                code = exit_.code
        text = out.getvalue() + err.getvalue()
        assert code in (0, 1, 2, 3), (code, text[-3000:])
        assert "Traceback" not in text, text[-3000:]
        errors = [line for line in err.getvalue().splitlines() if line.startswith("packrl")]
        assert len(errors) <= 1, err.getvalue()[-3000:]
        assert "\x1b" not in text, repr(text[:500])  # nothing from the files reaches the terminal raw
        assert snapshot(root, run) == before  # nothing outside the run folder written, removed or relinked
        assert victim.read_text() == "the user's file"

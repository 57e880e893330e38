"""``packrl plot`` and ``packrl inspect`` with hostile history and metadata files: wrong types, huge numbers,
non-finite numbers, nesting, control characters, lone surrogates, lines of gigabytes. Each ends with an exit
status and at most one ``packrl`` line on stderr, never a traceback; output goes to a strict UTF-8 stream, as to
a terminal; ``--json`` is strict JSON; nothing outside the run folder is written."""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packrl.checkpoint import manifest_sha256, save_checkpoint
from packrl.cli import main

ROOT = Path(__file__).resolve().parents[1]
ROWS = [{"iteration": i, "global_step": 128 * i, "episode_return": float(i)} for i in range(1, 6)]


def _run(argv):
    """``packrl ARGV`` in this process, its output through strict UTF-8 streams (a lone surrogate raises there
    as it does on a terminal): ``(exit status, stdout, stderr)``."""
    streams = [io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict") for _ in range(2)]
    with contextlib.redirect_stdout(streams[0]), contextlib.redirect_stderr(streams[1]):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    texts = []
    for stream in streams:
        stream.flush()
        texts.append(stream.buffer.getvalue().decode("utf-8"))
    return code, texts[0], texts[1]


def _history(run: Path, rows) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def _one_error_line(err: str) -> list[str]:
    lines = [line for line in err.splitlines() if line.startswith("packrl")]
    assert len(lines) <= 1 and "Traceback" not in err, err[-2000:]
    return lines


# ---------------------------------------------------------------- packrl plot: the issue's reproductions

@pytest.mark.parametrize("field, value, words", [
    ("global_step", "abc", "row 3: global_step 'abc' is not a finite number"),
    ("global_step", [1, 2], "row 3: global_step [1, 2] is not a finite number"),
    ("global_step", 10**400, "row 3: global_step 1000000000"),
    ("episode_return", 1e308, "row 3: episode_return 1e+308 is not a number within"),
    ("episode_return", -1e308, "row 3: episode_return -1e+308 is not a number within"),
])
def test_plot_leaves_out_a_row_it_cannot_plot_and_says_so_in_one_line(tmp_path, field, value, words):
    rows = [dict(r) for r in ROWS]
    rows[2][field] = value
    run = _history(tmp_path / "run", rows)
    code, out, err = _run(["plot", str(run)])
    assert code == 0, err
    [line] = _one_error_line(err)
    assert words in line and "1 of 5 rows left out of the curve" in line, line
    assert out.startswith("learning curve: ") and (run / "learning_curve.png").stat().st_size > 1000


def test_plot_of_only_unplottable_rows_exits_1_with_one_line(tmp_path):
    run = _history(tmp_path / "run", [{**r, "global_step": "abc"} for r in ROWS])
    code, out, err = _run(["plot", str(run)])
    [line] = _one_error_line(err)
    assert code == 1 and "nothing to draw" in line and "5 of 5 rows left out" in line and out == ""


def test_plot_names_the_line_where_reading_stopped(tmp_path):
    run = _history(tmp_path / "run", ROWS)
    with open(run / "history.jsonl", "a") as f:
        f.write('{"iteration": 6, "global_step": \n' + json.dumps(ROWS[0]) + "\n")
    code, _, err = _run(["plot", str(run)])
    [line] = _one_error_line(err)
    assert code == 0 and "line 6: not valid history line" in line and "the lines after it are left out" in line


def test_a_history_line_of_3_gb_is_not_read_whole(tmp_path):
    """A sparse file (no 3 GB on disk): a good line, a 3 GB line, a good line; under a 2 GiB address-space
    limit the whole line would not fit (the issue's MemoryError). The plot stops at the long line."""
    run = _history(tmp_path / "run", ROWS[:2])
    with open(run / "history.jsonl", "r+b") as f:
        f.seek(0, os.SEEK_END)
        f.write(b'{"iteration": 3, "note": "')
        f.seek(3 << 30, os.SEEK_CUR)  # a hole: reads as NUL bytes, takes no disk
        f.write(b'"}\n' + json.dumps(ROWS[2]).encode() + b"\n")
    assert (run / "history.jsonl").stat().st_size > 3 << 30
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
            "from packrl.cli import main; sys.exit(main(['plot', %r]))" % str(run))
    # quiet: the whole test takes 2 s
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    [line] = _one_error_line(done.stderr)
    assert f"line 3: longer than the {1 << 20:,} bytes packrl reads of a history line" in line


# ---------------------------------------------------------------- packrl inspect: the issue's reproductions

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    return save_checkpoint(tmp_path_factory.mktemp("inspect") / "run" / "checkpoint", net.state_dict(),
                           config={"policy": {"hidden": 8}}, env_id="CartPole-v1", seed=3, global_step=4096)


def _resigned(checkpoint: Path, folder: Path, **fields) -> Path:
    copy = folder / "run" / "checkpoint"
    shutil.copytree(checkpoint, copy)
    meta = json.loads((copy / "metadata.json").read_text())
    meta.update(fields)
    meta["sha256"] = manifest_sha256(meta)
    (copy / "metadata.json").write_text(json.dumps(meta))  # json writes "\ud800" and NaN as Python reads them
    return copy


@pytest.mark.parametrize("flags", [[], ["--full"], ["--json"]])
def test_inspect_prints_a_lone_surrogate_escaped(checkpoint, tmp_path, flags):
    copy = _resigned(checkpoint, tmp_path, note="a\ud800b", **{"k\udfff": 1})
    code, out, err = _run(["inspect", str(copy), *flags])
    assert code == 0, err
    if flags == ["--json"]:
        assert json.loads(out)["metadata"]["note"] == "a\ud800b"  # an escape in the JSON text
    else:
        assert "a\\ud800b" in out and "k\\udfff" in out


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"not RFC 8259 JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_inspect_json_is_strict_json_with_non_finite_numbers_as_strings(checkpoint, tmp_path):
    copy = _resigned(checkpoint, tmp_path, a=float("nan"), b=[float("inf"), -float("inf")], c={"d": 1e308})
    code, out, err = _run(["inspect", str(copy), "--json"])
    assert code == 0, err
    report = _strict(out)
    assert report["metadata"]["a"] == "NaN" and report["metadata"]["b"] == ["Infinity", "-Infinity"]
    assert report["metadata"]["c"] == {"d": 1e308} and out.isascii()


# ---------------------------------------------------------------- hypothesis: hostile files of every kind

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
hostile_text = st.one_of(
    st.text(st.characters(categories=("Cc", "Cf", "Zl", "Zp", "Lu", "Nd", "Po", "Sm")) | surrogates, max_size=30),
    st.sampled_from(["\x1b]0;pwned\x07", "\x1b[2J", "\u202e", "\x9b31m", "\r", "$\\frac{", "_hidden", "[red]x",
                     "nan", "inf", "-inf"]),
    st.integers(1 << 12, 1 << 18).map(lambda n: "x" * n),
)
numbers = st.one_of(st.integers(-(10**400), 10**400), st.floats(), st.sampled_from([1e308, -1e308, 2**63, -1]))
hostile_json = st.recursive(st.none() | st.booleans() | numbers | hostile_text,
                            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
                            max_leaves=10)
history_keys = st.sampled_from(["global_step", "episode_return", "vs_random/win", "iteration"]) | \
    hostile_text.map(lambda t: "episode_return/" + t)
history_row = st.dictionaries(history_keys, hostile_json, max_size=6)
good_row = st.builds(lambda i, r: {"iteration": i, "global_step": 64 * i, "episode_return": r},
                     st.integers(0, 10**6), st.floats(-1e6, 1e6))
history_line = st.one_of(
    history_row.map(lambda row: json.dumps(row).encode() + b"\n"),
    good_row.map(lambda row: json.dumps(row).encode() + b"\n"),
    st.binary(max_size=40).map(lambda raw: raw + b"\n"),
    st.integers(9, 5000).map(lambda depth: b"[" * depth + b"]" * depth + b"\n"),
    st.integers(1 << 20, 3 << 20).map(lambda n: b'{"x": "' + b"a" * n + b'"}\n'),
    st.integers(4300, 6000).map(lambda n: b'{"global_step": ' + b"9" * n + b"}\n"),
    st.just(b'{"global_step": 1, "episode_return": NaN}\n'),
)


def _snapshot(root: Path, run: Path) -> dict:
    return {str(p): p.read_bytes() if p.is_file() and not p.is_symlink() else str(p.readlink()) if p.is_symlink()
            else None for p in sorted(root.rglob("*")) if p != run and run not in p.parents}


@settings(max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(lines=st.lists(history_line, min_size=1, max_size=8), title=st.none() | hostile_text,
       link_curve=st.booleans())
def test_hostile_histories_never_give_a_traceback_or_write_outside_the_run(lines, title, link_curve):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run = root / "run"
        run.mkdir()
        (run / "history.jsonl").write_bytes(b"".join(lines))
        victim = root / "victim.png"
        victim.write_bytes(b"the user's file")
        if link_curve:
            (run / "learning_curve.png").symlink_to(victim)
        before = _snapshot(root, run)
        code, out, err = _run(["plot", str(run)] + ([] if title is None else ["--title", title]))
        assert code in (0, 1, 2), (code, err[-2000:])
        _one_error_line(err)
        assert "\x1b" not in out + err
        assert _snapshot(root, run) == before and victim.read_bytes() == b"the user's file"


@settings(max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(fields=st.dictionaries(hostile_text | st.sampled_from(["optimizer", "layouts", "resume", "config", "seed",
                                                              "global_step", "env_id", "format"]),
                              hostile_json, min_size=1, max_size=4),
       resign=st.booleans(), flags=st.sampled_from([[], ["--full"], ["--json"]]))
def test_hostile_metadata_never_gives_a_traceback(checkpoint, fields, resign, flags):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        copy = root / "run" / "checkpoint"
        shutil.copytree(checkpoint, copy)
        meta = json.loads((copy / "metadata.json").read_text())
        meta.update(fields)
        if resign:
            meta["sha256"] = manifest_sha256(meta)
        (copy / "metadata.json").write_text(json.dumps(meta))
        before = _snapshot(root, root / "run")
        code, out, err = _run(["inspect", str(copy), *flags])
        assert code in (0, 1, 2), (code, err[-2000:])
        _one_error_line(err)
        assert "\x1b" not in out + err
        if flags == ["--json"] and code in (0, 1):
            _strict(out)
            assert out.isascii()
        assert _snapshot(root, root / "run") == before

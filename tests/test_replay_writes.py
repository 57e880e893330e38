"""Replay files go through the one writer (atomic, never through a symlink), and a request the buffer can never
fill is refused before any memory is asked for."""
import numpy as np
import pytest

from packrl.errors import UsageError
from packrl.run_folders import RunError
from packrl.train.replay import ReplayBuffer
from packrl.train.replay_store import ARRAYS, METADATA


def _buffer(capacity=16):
    buf = ReplayBuffer(capacity, 2, (3,), np.float32, seed=0)
    for t in range(capacity + 3):
        obs = np.full((2, 3), t, np.float32)
        buf.add(obs, np.array([t, t]), np.ones(2, np.float32), np.array([t == 5, False]), np.zeros(2, bool), obs)
    return buf


@pytest.mark.parametrize("name", [METADATA + ".tmp", ARRAYS.replace(".safetensors", ".tmp")])
def test_save_never_writes_through_a_temporary_name_symlinked_to_a_user_file(tmp_path, name):
    user_file = tmp_path / "precious.txt"
    user_file.write_text("the user's own data\n")
    folder = tmp_path / "buffer"
    folder.mkdir()
    (folder / name).symlink_to(user_file)
    buf = _buffer()
    buf.save(folder)
    assert user_file.read_text() == "the user's own data\n"
    assert not (folder / METADATA).is_symlink() and not (folder / ARRAYS).is_symlink()
    loaded = ReplayBuffer.load(folder)
    assert np.array_equal(loaded.observations, buf.observations)


@pytest.mark.parametrize("name", [METADATA, ARRAYS])
def test_a_replay_file_that_is_a_symlink_is_refused(tmp_path, name):
    user_file = tmp_path / "precious.txt"
    user_file.write_text("the user's own data\n")
    folder = tmp_path / "buffer"
    folder.mkdir()
    (folder / name).symlink_to(user_file)
    with pytest.raises(RunError, match="symlink"):
        _buffer().save(folder)
    assert user_file.read_text() == "the user's own data\n"


def test_save_into_a_symlinked_folder_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "buffer").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RunError, match="symlink"):
        _buffer().save(tmp_path / "buffer")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_save_leaves_no_temporary_file(tmp_path):
    _buffer().save(tmp_path / "buffer")
    assert sorted(p.name for p in (tmp_path / "buffer").iterdir()) == sorted([ARRAYS, METADATA])


@pytest.mark.parametrize("length", [17, 10**12])
def test_a_sequence_longer_than_the_buffer_is_refused(length):
    with pytest.raises(UsageError, match=f"sequence_length {length:,} is longer than the buffer \\(16 slots per row\\)"):
        _buffer(16).sample_sequences(4, length)


def test_a_sequence_as_long_as_the_buffer_is_sampled():
    assert _buffer(16).sample_sequences(4, 16).masks.shape == (4, 16)

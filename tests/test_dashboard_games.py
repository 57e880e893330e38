"""The live view of a two-player zero-sum game: its score against a random opponent heads the figures in
every frame (measured every few iterations, kept in between), and the table keeps one width."""
import io

from rich.console import Console

from packrl.train.dashboard import SELF_PLAY_LABEL, Dashboard


def _frame(board):
    buffer = io.StringIO()
    Console(file=buffer, width=120, color_system=None).print(board.table())
    return buffer.getvalue()


def test_the_win_rate_row_is_in_every_frame_and_the_width_is_fixed():
    board = Dashboard("game", 10_000, live=False, console=Console(file=io.StringIO()), versus=True)
    frames = []
    for iteration in range(1, 31):
        stats = {"iteration": iteration, "global_step": 100 * iteration, "episode_return": 0.0,
                 "episode_return/player_0": 0.5, "episode_return/player_1": -0.5, "pg_loss": 0.01}
        if iteration % 10 == 0:  # the versus check runs every 10 iterations
            stats.update({"vs_random/win": 0.6, "vs_random/draw": 0.1, "vs_random/loss": 0.3})
        board.update(stats)
        frames.append(_frame(board))
    assert all("vs random: win / draw / loss" in f for f in frames)
    assert "- / - / -" in frames[0] and all("0.60 / 0.10 / 0.30" in f for f in frames[9:])
    widths = {max(len(line) for line in f.splitlines()) for f in frames}
    assert len(widths) == 1, widths
    lines = [line for line in frames[-1].splitlines() if "│" in line]
    assert "vs random" in lines[1] and SELF_PLAY_LABEL in frames[-1]  # the score heads the figures


def test_a_single_agent_table_is_unchanged_in_width_and_rows():
    board = Dashboard("cartpole", 10_000, live=False, console=Console(file=io.StringIO()))
    board.update({"iteration": 1, "global_step": 100})
    first = _frame(board)
    board.update({"iteration": 2, "global_step": 200, "episode_return": 123.456789, "sps": 123456.0})
    second = _frame(board)
    assert "vs random" not in second and "episode return" in second
    assert max(map(len, first.splitlines())) == max(map(len, second.splitlines()))

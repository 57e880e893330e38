"""Networks between encoder and decoder: MLP, LSTM, GRU and MinGRU, one interface.

Every network has ``input_size``, ``hidden_size`` and

- ``initial_state(batch_size, device) -> tuple`` of zero tensors ``(batch, hidden)`` (empty for MLP);
- ``step(x (B, in), state, done=None) -> (y (B, hidden), state)``: one rollout step;
- ``sequence(x (B, T, in), state, done=None) -> (y (B, T, hidden), state)``: training.

``done`` (bool, ``(B,)`` or ``(B, T)``) marks rows whose input is the first observation of a new
episode (the terminals | truncations returned with it): their state is zeroed before that input.
Stepping ``step`` T times equals one ``sequence`` over T, resets included.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from packrl.torch_private import fused_gru, fused_lstm

State = tuple[torch.Tensor, ...]

ACTIVATIONS: dict[str, tuple] = {"relu": (torch.relu, nn.ReLU), "tanh": (torch.tanh, nn.Tanh)}
"""The feedforward layers' nonlinearity by name: the function the forward calls and the module that shows it."""


def activation(name: str) -> tuple:
    """``(function, module class)`` of an activation name; ValueError naming the choices otherwise."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}") from None


def _keep(done: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """1 where the state carries over, 0 where an episode starts, shaped to broadcast on ``like``."""
    if done is None:
        return None
    return (~done.bool()).to(like.dtype).unsqueeze(-1)


class MLP(nn.Module):
    """Feedforward: ``layers`` Linear + activation (ReLU, or tanh) blocks. Stateless (its state is ``()``)."""

    def __init__(self, input_size: int, hidden_size: int = 128, layers: int = 1, activation_name: str = "relu"):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self._act, module = activation(activation_name)
        self.activation = activation_name
        blocks: list[nn.Module] = []
        for i in range(layers):
            blocks += [nn.Linear(input_size if i == 0 else hidden_size, hidden_size), module()]
        self.net = nn.Sequential(*blocks) if blocks else nn.Identity()
        self.linears = tuple(blocks[::2])  # a plain tuple, not registered twice (state_dict keys stay net.*)
        if not blocks:
            self.hidden_size = input_size

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> State:
        return ()

    def _layers(self, x: torch.Tensor) -> torch.Tensor:
        # The blocks' own Linear + activation, applied directly: at rollout batch sizes a module call per
        # layer costs about as much as the layer itself.
        for layer in self.linears:
            x = self._act(F.linear(x, layer.weight, layer.bias))
        return x

    def step(self, x: torch.Tensor, state: State, done: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        return self._layers(x), state

    def sequence(self, x: torch.Tensor, state: State, done: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        return self._layers(x), state


class TwinMLP(nn.Module):
    """Two feedforward layers side by side, the actor's and the critic's (``critic="separate"``), sharing no
    weight: input ``(N, 2 * hidden)`` holds both paths' features (the encoder's projection to twice the width),
    output ``(2, N, hidden)`` holds the actor's then the critic's. Both run as one batched matmul (a block-diagonal
    layer), so a separate critic costs one op where two MLPs would cost one each. Each block starts as an
    ``nn.Linear`` does. Stateless (its state is ``()``)."""

    def __init__(self, hidden_size: int = 128, activation_name: str = "relu"):
        super().__init__()
        self.input_size, self.hidden_size = 2 * hidden_size, hidden_size
        self._act = activation(activation_name)[0]
        self.activation = activation_name
        self.weight = nn.Parameter(torch.empty(2, hidden_size, hidden_size))
        self.bias = nn.Parameter(torch.empty(2, 1, hidden_size))
        for block, bias in zip(self.weight, self.bias):  # nn.Linear.reset_parameters, block by block
            nn.init.kaiming_uniform_(block, a=math.sqrt(5))
            nn.init.uniform_(bias, -1 / math.sqrt(hidden_size), 1 / math.sqrt(hidden_size))

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> State:
        return ()

    def _layers(self, x: torch.Tensor) -> torch.Tensor:
        both = x.reshape(-1, 2, self.hidden_size).transpose(0, 1)  # (2, N, hidden): a view, no copy
        return self._act(torch.baddbmm(self.bias, both, self.weight.transpose(1, 2)))

    def step(self, x: torch.Tensor, state: State, done: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        return self._layers(x), state

    def sequence(self, x: torch.Tensor, state: State, done: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        return self._layers(x), state


class _Recurrent(nn.Module):
    """Shared parts of LSTM and GRU: PyTorch's parameter shapes and gate order (``gates`` gates),
    orthogonal weights, zero biases. The parameters are plain (no ``nn.LSTM`` module) because
    Dynamo refuses to trace RNN modules; the fused kernel is still used in eager mode for
    sequences without resets (what ``nn.LSTM`` calls, through ``packrl.torch_private``; Inductor cannot compile
    it), and the cell is stepped where this torch has no such kernel."""

    gates = 1

    def __init__(self, input_size: int, hidden_size: int = 128):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        width = self.gates * hidden_size
        self.weight_ih = nn.Parameter(nn.init.orthogonal_(torch.empty(width, input_size)))
        self.weight_hh = nn.Parameter(nn.init.orthogonal_(torch.empty(width, hidden_size)))
        self.bias_ih = nn.Parameter(torch.zeros(width))
        self.bias_hh = nn.Parameter(torch.zeros(width))

    @property
    def _params(self) -> list[torch.Tensor]:
        return [self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh]

    def _fused(self, done: torch.Tensor | None) -> bool:
        return done is None and not torch.compiler.is_compiling()


class LSTM(_Recurrent):
    """One LSTM layer. Sequences with ``done`` run the cell step by step (the input projection done
    once for all T), so states reset exactly where episodes start."""

    gates = 4

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> State:
        zeros = torch.zeros(batch_size, self.hidden_size, device=device)
        return (zeros, zeros.clone())

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight_ih.T + self.bias_ih + self.bias_hh

    def _cell(self, gates_x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        i, f, g, o = (gates_x + h @ self.weight_hh.T).chunk(4, -1)  # PyTorch's gate order
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    def step(self, x: torch.Tensor, state: State, done: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        h, c = state
        keep = _keep(done, h)
        if keep is not None:
            h, c = h * keep, c * keep
        h, c = self._cell(self._input(x), h, c)
        return h, (h, c)

    def sequence(self, x: torch.Tensor, state: State, done: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        h, c = state
        fused = fused_lstm(x, h, c, self._params, self.training) if self._fused(done) else None
        if fused is not None:
            y, h, c = fused
            return y, (h, c)
        gates_x, keep, outputs = self._input(x), _keep(done, h), []
        for t in range(x.shape[1]):
            if keep is not None:
                h, c = h * keep[:, t], c * keep[:, t]
            h, c = self._cell(gates_x[:, t], h, c)
            outputs.append(h)
        return torch.stack(outputs, 1), (h, c)


class GRU(_Recurrent):
    """One GRU layer; same scheme as LSTM (fused without resets in eager mode, stepwise otherwise)."""

    gates = 3

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> State:
        return (torch.zeros(batch_size, self.hidden_size, device=device),)

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight_ih.T + self.bias_ih

    def _cell(self, gates_x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        x_r, x_z, x_n = gates_x.chunk(3, -1)  # PyTorch's gate order: reset, update, new
        h_r, h_z, h_n = (h @ self.weight_hh.T + self.bias_hh).chunk(3, -1)
        r, z = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
        n = torch.tanh(x_n + r * h_n)
        return (1 - z) * n + z * h

    def step(self, x: torch.Tensor, state: State, done: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        (h,) = state
        keep = _keep(done, h)
        if keep is not None:
            h = h * keep
        h = self._cell(self._input(x), h)
        return h, (h,)

    def sequence(self, x: torch.Tensor, state: State, done: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        (h,) = state
        fused = fused_gru(x, h, self._params, self.training) if self._fused(done) else None
        if fused is not None:
            y, h = fused
            return y, (h,)
        gates_x, keep, outputs = self._input(x), _keep(done, h), []
        for t in range(x.shape[1]):
            if keep is not None:
                h = h * keep[:, t]
            h = self._cell(gates_x[:, t], h)
            outputs.append(h)
        return torch.stack(outputs, 1), (h,)


class MinGRU(nn.Module):
    """minGRU (Feng et al. 2024, "Were RNNs All We Needed?"): gates depend on the input only,

        z_t = sigmoid(W_z x_t),  h~_t = g(W_h x_t),  h_t = (1 - z_t) * h_{t-1} + z_t * h~_t,

    so a sequence is the linear recurrence ``h_t = a_t h_{t-1} + b_t``, computed in training by a
    parallel (Hillis-Steele) scan over time: log2(T) elementwise rounds, no Python loop over T.
    An episode start sets ``a_t = 0``. Rollouts step it sequentially.

    Two choices the paper leaves open, both measured on a cue-then-answer memory task
    (``tests/test_mingru.py``; delay 4 and 8, PPO, 40k steps): the update gate's bias starts at
    ``GATE_BIAS`` = -2 (z = 0.12: the state is kept by default, as an LSTM's forget gate starts open),
    and the output (not the state) goes through a LayerNorm, as the paper's stacked models normalise
    each block's output. With both, minGRU learned the task as fast as the GRU (0.95 by 15k steps at
    delay 4, 0.83 by 25k at delay 8, the GRU 0.86); with neither it stood at 0.45 after 40k."""

    GATE_BIAS = -2.0

    def __init__(self, input_size: int, hidden_size: int = 128):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.proj = nn.Linear(input_size, 2 * hidden_size)
        with torch.no_grad():
            self.proj.bias[:hidden_size].fill_(self.GATE_BIAS)
        self.norm = nn.LayerNorm(hidden_size)

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> State:
        return (torch.zeros(batch_size, self.hidden_size, device=device),)

    def _coefficients(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, candidate = self.proj(x).chunk(2, -1)
        z = torch.sigmoid(gate)
        # g keeps candidates positive and continuous, as in the paper's log-space version
        g = torch.where(candidate >= 0, candidate + 0.5, torch.sigmoid(candidate))
        return 1 - z, z * g

    def step(self, x: torch.Tensor, state: State, done: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        (h,) = state
        a, b = self._coefficients(x)
        keep = _keep(done, h)
        if keep is not None:
            a = a * keep
        h = a * h + b
        return self.norm(h), (h,)

    def sequence(self, x: torch.Tensor, state: State, done: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        (h0,) = state
        a, b = self._coefficients(x)
        keep = _keep(done, h0)
        if keep is not None:
            a = a * keep
        a_cum, b_cum = linear_scan(a, b)
        h = a_cum * h0.unsqueeze(1) + b_cum
        return self.norm(h), (h[:, -1],)


def linear_scan(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inclusive scan of ``h_t = a_t h_{t-1} + b_t`` over axis 1: returns ``(A, B)`` with
    ``h_t = A_t h_0 + B_t``. Composition ``(a1, b1) then (a2, b2) = (a1 a2, a2 b1 + b2)``."""
    steps, shift = a.shape[1], 1
    while shift < steps:
        a_prev = torch.cat([torch.ones_like(a[:, :shift]), a[:, :-shift]], 1)
        b_prev = torch.cat([torch.zeros_like(b[:, :shift]), b[:, :-shift]], 1)
        a, b = a * a_prev, a * b_prev + b
        shift *= 2
    return a, b


NETWORKS = {"mlp": MLP, "lstm": LSTM, "gru": GRU, "mingru": MinGRU}


def make_network(name: str, input_size: int, hidden_size: int = 128, activation_name: str = "relu") -> nn.Module:
    """A network by name: "mlp", "lstm", "gru" or "mingru"; ``activation_name`` is the MLP's (the recurrent
    cores keep their own gates' nonlinearities)."""
    if name not in NETWORKS:
        raise ValueError(f"unknown network {name!r}; choose one of {sorted(NETWORKS)}")
    if name == "mlp":
        return MLP(input_size, hidden_size, activation_name=activation_name)
    return NETWORKS[name](input_size, hidden_size)

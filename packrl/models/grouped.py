"""GroupedPolicy: one Policy per agent group of an env whose agents have different observation spaces.

A heterogeneous env (MPE's simple_tag: predators and prey) pads every row to the widest group's layout. Row ``r``
belongs to agent ``r % agents_per_copy`` and so to that agent's group; each group's Policy reads its own rows,
and the logits and values come back in row order, so PPO's storage, sampling and losses see one policy. The groups
share one action layout (one decoder's distribution samples every row); their observations may differ freely.

Where rows arrive in order (a rollout step over every row, an eval) ``rows`` may be left out; where they do not
(a shuffled minibatch, the final observations of truncated rows) the caller passes each row's index.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from packrl.errors import EmulationError
from packrl.models.networks import State
from packrl.models.policy import Policy


class GroupedPolicy(nn.Module):
    """``policies[g]`` acts for the rows of group ``g``; ``agent_group[a]`` is the group of a copy's agent ``a``."""

    graph_safe = False  # splitting rows by group reads their count on the host

    def __init__(self, policies: Sequence[Policy], agent_group: Sequence[int]):
        super().__init__()
        self.groups = nn.ModuleList(policies)
        if len(self.groups) < 2 or sorted(set(agent_group)) != list(range(len(self.groups))):
            raise EmulationError(f"agent_group {list(agent_group)} must name each of the {len(self.groups)} policies "
                                 "(and there must be two or more)")
        for g, policy in enumerate(self.groups):
            if len(policy.initial_state(1)) > 0:
                raise EmulationError(f"group {g}'s policy is recurrent: a GroupedPolicy takes stateless (mlp) policies")
        self.register_buffer("agent_group", torch.as_tensor(list(agent_group), dtype=torch.long), persistent=False)

    @classmethod
    def from_env(cls, env: Any, config: Any = None, **settings: Any) -> "GroupedPolicy":
        """One ``Policy.from_env(env, config, group=g)`` per group of ``env.emulated``; EmulationError where the
        groups' action spaces differ (one decoder samples every row)."""
        emulated = env.emulated
        first = emulated.groups[0]
        for group in emulated.groups[1:]:
            if group.action != first.action:
                raise EmulationError(
                    f"agents {'/'.join(map(str, first.agents))} act in {first.action.space} and "
                    f"{'/'.join(map(str, group.agents))} in {group.action.space}: a GroupedPolicy needs one action "
                    "space for every group")
        policies = [Policy.from_env(env, config, group=g, **settings) for g in range(len(emulated.groups))]
        return cls(policies, emulated.row_group)

    @property
    def decoder(self) -> Any:
        """The first group's decoder: its distribution (the same for every group) samples and scores every row."""
        return self.groups[0].decoder

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> State:
        return ()

    def split(self, count: int, rows: torch.Tensor | None, device: torch.device) -> list[tuple[Policy, torch.Tensor]]:
        """(policy, positions ``(k,)`` of its rows) of each group with rows among ``count`` rows whose indices are
        ``rows`` (None: 0..count-1)."""
        if rows is None:
            rows = torch.arange(count, device=device)
        group = self.agent_group.to(device)[rows % len(self.agent_group)]
        parts = [(policy, torch.nonzero(group == g).reshape(-1)) for g, policy in enumerate(self.groups)]
        return [(policy, where) for policy, where in parts if where.numel()]

    def forward_eval(self, x: torch.Tensor, state: State = (), done: torch.Tensor | None = None,
                     rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, State]:
        """One rollout step of rows ``x (B, nbytes)``: ``(logits (B, L), values (B,), ())``."""
        parts = self.split(x.shape[0], rows, x.device)
        outputs = [policy.forward_eval(x[where])[:2] for policy, where in parts]
        return *_in_row_order(parts, outputs), ()

    def forward(self, x: torch.Tensor, state: State = (), done: torch.Tensor | None = None,
                rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, State]:
        """Training: segments ``x (B, T, nbytes)`` whose rows are ``rows`` (``(B,)`` or ``(B, T)``, constant
        along T): ``(logits (B, T, L), values (B, T), ())``."""
        rows = rows[:, 0] if rows is not None and rows.ndim == 2 else rows
        parts = self.split(x.shape[0], rows, x.device)
        outputs = [policy.forward(x[where])[:2] for policy, where in parts]
        return *_in_row_order(parts, outputs), ()

    def update_normalization(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Each group's normalizing encoder takes in its own rows of ``x (B, nbytes)``."""
        for policy, where in self.split(x.shape[0], rows, x.device):
            policy.update_normalization(x[where])

    def average_normalization(self, world: int) -> None:
        for policy in self.groups:
            policy.average_normalization(world)

    def distribution(self, logits: torch.Tensor) -> Any:
        return self.decoder.distribution(logits)


def _in_row_order(parts: list[tuple[Policy, torch.Tensor]], outputs: list[tuple[torch.Tensor, torch.Tensor]]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The groups' (logits, values), concatenated and put back in the order of the rows they came from."""
    inverse = torch.argsort(torch.cat([where for _, where in parts]))
    logits = torch.cat([logits for logits, _ in outputs])[inverse]
    values = torch.cat([values for _, values in outputs])[inverse]
    return logits, values

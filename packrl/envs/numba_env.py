"""Numba-native envs: a user contract of two ``@njit`` kernels, and a batched stepper over many copies.

The contract (:class:`NumbaEnv`)::

    @njit
    def reset(state, obs, rng) -> None
    @njit
    def step(state, action, obs, rng) -> (reward: float, terminated: bool, truncated: bool)

``state`` is a namedtuple of this copy's state arrays (declared as ``{"name": (shape, dtype)}``),
``obs`` is this copy's observation: the array itself for a Box observation, otherwise a namedtuple
with one typed array per leaf, named by its Dict keys joined with ``_`` (``obs.image``,
``obs.position``); scalar leaves (Discrete, scalar Box) are length-1 arrays (``obs.direction[0] = d``).
Every leaf is a zero-copy view of this copy's packed row, placed by the Layout: nobody computes a
byte offset by hand. ``action`` is the policy-facing action: an int64 choice in ``[0, n)`` for
Discrete (the space's ``start`` not added), an int64 array of choices for MultiDiscrete-like
spaces, a float array for Box, ``action.discrete``/``action.continuous`` for hybrid spaces.
``rng`` is this copy's own random stream (see :mod:`packrl.envs.rng`).

The batched stepper generates one small module per env (kept under ``PACKRL_NUMBA_CACHE``,
default ``~/.cache/packrl/numba``, its name a hash of everything that shapes the code) holding one
compiled loop over all copies with same-step autoreset, compiled with ``cache=True`` so a second
process loads it from disk instead of compiling.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import keyword
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import gymnasium
import numba
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space
from numba import njit, types
from numba.core import errors as numba_errors
from numba.core.dispatcher import Dispatcher
from numba.extending import overload

from packrl._codegen import Code, import_generated
from packrl.emulation.actions import ActionLayout
from packrl.emulation.emulated import Emulated, group_agents
from packrl.emulation.layout import Layout, Leaf
from packrl.emulation.rows import row_format
from packrl.emulation.tree import iter_leaves
from packrl.emulation.values import format_path
from packrl.env_protocol import SAME_STEP, Batch, NoEnvObjects
from packrl.envs.rng import RNG_WORDS
from packrl.envs.thread_choice import SERIAL, ThreadChoice
from packrl.errors import EmulationError, EnvError, UsageError


def _threading_layer_apart_from_torch() -> None:
    """Keep Numba's parallel kernels off the OpenMP state torch uses, unless the user chose a threading layer
    (``NUMBA_THREADING_LAYER`` or ``numba.config.THREADING_LAYER``). Numba's OpenMP layer, its default where TBB
    is missing, leaves ``omp_get_max_threads()`` at Numba's thread count after a parallel kernel; torch (and MKL
    under it) read that as their own: ``torch.set_num_threads(1)`` silently became 2, and a small policy's
    rollout then ran 12x slower (18.8 against 225 ms for 64 steps of 8 gridworlds after a 2048-copy gridworld
    stepped; benchmarks/README.md, overlap.py). TBB where installed, else Numba's own workqueue, share nothing."""
    if os.environ.get("NUMBA_THREADING_LAYER") or numba.config.THREADING_LAYER != "default":
        return
    numba.config.THREADING_LAYER = "tbb" if importlib.util.find_spec("tbb") is not None else "workqueue"


_threading_layer_apart_from_torch()

PARALLEL_MIN_ENVS = 1024
"""Below this many copies ``threads=None`` steps them in one serial loop: the crossover of 2 threads
against the serial loop with CartPole on an idle 2-core machine (benchmarks/README.md, numba_envs.py).
From there it times the serial loop against the threads while it runs and steps with the faster
(:class:`packrl.envs.thread_choice.ThreadChoice`): where other jobs hold the cores, a fork-join waits
for whichever thread was descheduled, and the serial loop wins."""


# ---------------------------------------------------------------- the user contract

@dataclass(frozen=True)
class NumbaEnv:
    """An env written as Numba kernels. ``state`` maps field names to ``(shape, dtype)`` per copy;
    ``max_episode_steps`` truncates episodes (as gymnasium's TimeLimit); ``allow_nan`` lets float
    observation leaves hold NaN (refused by default: a NaN observation is almost always a bug)."""

    name: str
    observation_space: spaces.Space | Mapping[str, spaces.Space]
    """One space for every agent, or (with ``agents``) ``{agent: space}``: agents with different observation
    spaces, grouped as emulation groups a PettingZoo env's agents, each group's agents adjacent in ``agents``."""
    action_space: spaces.Space
    state: Mapping[str, tuple]
    reset: Any
    step: Any
    max_episode_steps: int | None = None
    allow_nan: bool = False
    description: str = field(default="", compare=False)
    agents: tuple = ()
    """The agents of one copy (PettingZoo's ``possible_agents``), each with ``observation_space`` and
    ``action_space``; empty: one agent and the single-agent kernels above. With agents the kernels are
    ``reset(state, obs, live, rng)`` and ``step(state, actions, obs, rewards, terminated, truncated, live, rng)``
    (:mod:`packrl.envs.numba_agents`)."""
    turns: bool = False
    """Agents move in turns (an AEC game): ``live`` marks the one agent due to move (:mod:`packrl.envs.numba_agents`)."""

    def __post_init__(self) -> None:
        for role in ("reset", "step"):
            fn = getattr(self, role)
            if not isinstance(fn, Dispatcher):
                raise EnvError(f"numba env {self.name!r}: {role} must be an @numba.njit function, got {type(fn).__name__}")
        if not self.state:
            raise EnvError(f"numba env {self.name!r}: declare at least one state array, e.g. state={{'x': (4, np.float64)}}")
        for key, spec in self.state.items():
            _check_identifier(self.name, "state field", key)
            try:
                shape, dtype = spec
                _as_shape(shape), np.dtype(dtype)
            except (TypeError, ValueError):
                raise EnvError(f"numba env {self.name!r}: state field {key!r} must be (shape, dtype), got {spec!r}") from None
        if self.turns and len(self.agents) < 2:
            raise EnvError(f"numba env {self.name!r}: turns=True needs at least two agents, got {list(self.agents)}")
        if len(set(self.agents)) != len(self.agents) or any(not isinstance(a, str) or not a for a in self.agents):
            raise EnvError(f"numba env {self.name!r}: agents must be distinct non-empty names, got {list(self.agents)}")
        if self.max_episode_steps is not None and int(self.max_episode_steps) <= 0:
            raise EnvError(f"numba env {self.name!r}: max_episode_steps must be positive, got {self.max_episode_steps}")
        if not isinstance(self.action_space, spaces.Space):
            raise EnvError(f"numba env {self.name!r}: action_space must be one gymnasium Space, shared by the agents "
                           f"(per-agent action spaces are not supported), got {type(self.action_space).__name__}")
        if not isinstance(self.observation_space, spaces.Space):  # {agent: space} (a spaces.Dict is one space)
            if not isinstance(self.observation_space, Mapping) or not all(
                    isinstance(v, spaces.Space) for v in self.observation_space.values()):
                raise EnvError(f"numba env {self.name!r}: observation_space must be a gymnasium Space or "
                               f"{{agent: Space}}, got {type(self.observation_space).__name__}")
            if not self.agents:
                raise EnvError(f"numba env {self.name!r}: observation spaces per agent need agents=(...)")
            if set(self.observation_space) != set(self.agents):
                raise EnvError(f"numba env {self.name!r}: observation_space has agents {sorted(self.observation_space)}, "
                               f"agents are {list(self.agents)}")

    def observation_space_of(self, agent: str) -> spaces.Space:
        """The observation space of one agent."""
        if isinstance(self.observation_space, spaces.Space):
            return self.observation_space
        return self.observation_space[agent]


def _as_shape(shape: Any) -> tuple:
    return (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)


def _check_identifier(env: str, what: str, name: str) -> None:
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        raise EnvError(f"numba env {env!r}: {what} {name!r} is not a usable Python identifier for kernel code")


# ---------------------------------------------------------------- helpers the generated kernels call

def check_step_result(result):  # noqa: ANN001, ANN201 - numba's overload needs the bare signature
    """Identity at run time; at compile time refuses a step that does not return (float, bool, bool)."""
    return result


@overload(check_step_result)
def _check_step_result_typing(result):  # noqa: ANN001, ANN202
    ok = (isinstance(result, types.BaseTuple) and len(result) == 3
          and isinstance(result[0], (types.Float, types.Integer))
          and isinstance(result[1], types.Boolean) and isinstance(result[2], types.Boolean))
    if not ok:
        raise numba_errors.TypingError(
            f"step must return (reward: float, terminated: bool, truncated: bool), got {result}")
    return lambda result: result


# ---------------------------------------------------------------- what the kernel sees

@dataclass(frozen=True)
class LeafCheck:
    """How one observation leaf is checked after each kernel call."""

    index: int
    leaf: Leaf
    field: str
    kind: str  # "nan", "range" or "none"
    low: np.ndarray | None = None
    high: np.ndarray | None = None

    def describe(self) -> str:
        if self.kind == "range":
            return f"[{self.low.min()}, {self.high.max()}]"
        return "no NaN"


def _leaf_key(path: tuple) -> str:
    name = "_".join(str(k) for k in path) or "obs"
    return name if name[0].isalpha() else "leaf_" + name


def leaf_checks(env: NumbaEnv, layout: Layout) -> tuple[LeafCheck, ...]:
    """One check per field of each leaf (named by its codec, ``kernel_names``): NaN for float
    fields, the field's bounds for bounded integer fields."""
    checks, seen = [], {}
    for path, node in iter_leaves(layout.root):
        try:
            names = node.codec.kernel_names(_leaf_key(path))
        except EmulationError as err:
            raise EnvError(f"numba env {env.name!r}: observation leaf {format_path(path)!r} {err}") from None
        for leaf_id, name in zip(node.leaf_ids, names):
            leaf = layout.leaves[leaf_id]
            _check_identifier(env.name, "observation leaf", name)
            if name in seen:
                raise EnvError(f"numba env {env.name!r}: observation leaves {seen[name]!r} and {leaf.name!r} both become "
                               f"kernel field {name!r}; rename a Dict key")
            seen[name] = leaf.name
            checks.append(LeafCheck(leaf_id, leaf, name, *_bounds(env, leaf, leaf.shape or (1,))))
    return tuple(checks)


def _bounds(env: NumbaEnv, leaf: Leaf, shape: tuple) -> tuple:
    """NaN for float leaves; the leaf's own bounds (``leaf.bounds``) for integer leaves narrower
    than their dtype; nothing for bools (a kernel writes them canonical) and unbounded leaves."""
    if leaf.dtype.kind == "f":
        return ("none",) if env.allow_nan else ("nan",)
    bounds = leaf.bounds
    if bounds is None or not bounds.integer or not bounds.needed or leaf.dtype.kind == "b":
        return ("none",)  # every bit pattern is a valid value: nothing to check
    return "range", bounds.low.reshape(shape).copy(), bounds.high.reshape(shape).copy()


# ---------------------------------------------------------------- code generation

_HEADER = '''"""Generated by packrl.envs.numba_env for numba env {name!r}. Do not edit: the file name is a hash of its inputs."""
import numpy as np
from numba import njit, prange

from packrl.envs.kernel_types import record
from packrl.envs.numba_env import check_step_result
from packrl.envs.rng import seed_rng

State = record("State", {state_fields!r})
{obs_class}{action_class}
# The kernels run with _nrt=False: they allocate nothing, and without reference counting the
# per-copy views (state, obs, rng rows) cost no atomic increments (2-3x faster on CartPole).
# set by packrl right after import, before anything compiles
user_reset = None
user_step = None
MAX_STEPS = {max_steps}
NLEAVES = {nleaves}
'''


class KernelSource:
    """The Python source of one env's batched kernels, and the constants it reads."""

    def __init__(self, env: NumbaEnv, layout: Layout, action: ActionLayout, passthrough: bool):
        self.env, self.layout, self.action, self.passthrough = env, layout, action, passthrough
        self.row_shape = tuple(env.observation_space.shape) if passthrough else (layout.nbytes,)
        self.checks = leaf_checks(env, layout)
        self.state_fields = list(env.state)
        self.constants: dict[str, np.ndarray] = {}
        for c in self.checks:
            if c.kind == "range":
                self.constants[f"LOW_{c.index}"], self.constants[f"HIGH_{c.index}"] = c.low, c.high

    # argument lists
    @property
    def act_args(self) -> list[str]:
        return ["act_d", "act_c"] if self.action.kind == "hybrid" else ["act"]

    @property
    def state_args(self) -> list[str]:
        return [f"s_{k}" for k in range(len(self.state_fields))]

    @property
    def obs_args(self) -> list[str]:
        return [f"o_{c.index}" for c in self.checks]

    def _buffers(self) -> list[str]:
        return ["observations", *self.obs_args, "final_observations", "rng", "rewards", "terminals",
                "truncations", "returns", "lengths", "bad"]

    def step_args(self) -> list[str]:
        return [*self.act_args, *self.state_args, *self._buffers()]

    def reset_args(self) -> list[str]:
        return ["seed", "seeded", *self.state_args, *self._buffers()]

    # pieces
    def _state_expr(self) -> str:
        return "State(" + ", ".join(f"{s}[i]" for s in self.state_args) + ")"

    def _obs_expr(self) -> str:
        if self.passthrough:
            return "o_0[i]"
        return "Obs(" + ", ".join(f"{o}[i]" for o in self.obs_args) + ")"

    def _action_expr(self) -> str:
        return "Action(act_d[i], act_c[i])" if self.action.kind == "hybrid" else "act[i]"

    def _leaf_checks(self, code: Code, code_offset: int) -> None:
        """Loops over each checked leaf of copy ``i``: on a bad element, record the leaf in ``bad``
        and set ``c = -1``."""
        for c in self.checks:
            if c.kind == "none":
                continue
            with code.loops(c.leaf.shape or (1,), var="j") as inner:
                x = f"x{c.index}"  # one name per leaf: leaves differ in dtype
                code(f"{x} = o_{c.index}[i, {inner}]")
                cond = f"{x} != {x}" if c.kind == "nan" else f"{x} < LOW_{c.index}[{inner}] or {x} > HIGH_{c.index}[{inner}]"
                with code.block(f"if {cond}:"):
                    code(f"bad[i] = {code_offset + c.index}", "c = -1")

    def _row_copy(self, code: Code) -> None:
        """final_observations[i] = observations[i] as plain loops (Numba's array assignment drags in
        a shape-mismatch error path that costs seconds of compile time)."""
        with code.loops(self.row_shape, var="j") as inner:
            code(f"final_observations[i, {inner}] = observations[i, {inner}]" if inner
                 else "final_observations[i] = observations[i]")

    @staticmethod
    def _step_drivers(code: Code, step_args: str) -> None:
        """``step_serial`` and ``step_parallel``: ``_step_range`` over all copies, in one loop or in chunks."""
        def head() -> None:  # the actions were checked before the call (ActionLayout.check_batch)
            code("# >= 0: the number of episodes that ended; -(n + 1): some copies wrote a leaf out of its",
                 "# space (see bad)", "n = rewards.shape[0]")

        code("", "", "@njit(cache=True, nogil=True, _nrt=False)")
        with code.block(f"def step_serial({step_args}):"):
            head()
            code(f"ends, failed = _step_range(0, n, {step_args})", "return -(n + 1) if failed > 0 else ends")
        # parfors need reference counting, so the threaded kernel only splits the copies into chunks
        # and each thread runs the reference-count-free loop above on its chunk
        code("", "", "@njit(cache=True, nogil=True, parallel=True)")
        with code.block(f"def step_parallel({step_args}, chunks):"):
            head()
            code("chunks = min(n, chunks)", "ends = 0", "failed = 0",
                 "for c in prange(chunks):",
                 f"    e, f = _step_range(c * n // chunks, (c + 1) * n // chunks, {step_args})",
                 "    ends += e",
                 "    failed += f",
                 "return -(n + 1) if failed > 0 else ends")

    def source(self) -> str:
        env = self.env
        obs_class = "" if self.passthrough else f'Obs = record("Obs", {tuple(c.field for c in self.checks)!r})\n'
        action_class = 'Action = record("Action", ("discrete", "continuous"))\n' if self.action.kind == "hybrid" else ""
        nleaves = len(self.checks)
        code = Code()
        code(_HEADER.format(name=env.name, state_fields=tuple(self.state_fields), obs_class=obs_class,
                            action_class=action_class, max_steps=int(env.max_episode_steps or 0), nleaves=nleaves))
        code(*(f"{name} = None" for name in self.constants))
        step_args = ", ".join(self.step_args())
        code("", "", "@njit(cache=True, nogil=True, _nrt=False)")
        with code.block(f"def _step_range(lo, hi, {step_args}):"):
            code("# copies lo .. hi - 1: (episodes ended, copies that wrote a leaf out of its space)",
                 "ends = 0", "failed = 0")
            # the body of one copy's step, inlined in both loops: every extra level of Numba function
            # calls re-optimizes everything below it, so a flat kernel compiles in a fraction of the time
            with code.block("for i in range(lo, hi):"):
                code(f"state = {self._state_expr()}",
                     f"obs = {self._obs_expr()}",
                     f"reward, terminated, truncated = check_step_result(user_step(state, {self._action_expr()}, obs, rng[i]))",
                     "lengths[i, 0] += 1",
                     "returns[i, 0] += reward",
                     "if MAX_STEPS > 0 and lengths[i, 0] >= MAX_STEPS:",
                     "    truncated = True",
                     "rewards[i] = reward",
                     "terminals[i] = terminated",
                     "truncations[i] = truncated",
                     "c = 0")
                self._leaf_checks(code, 0)
                with code.block("if c == 0 and (terminated or truncated):"):
                    self._row_copy(code)
                    code("returns[i, 1] = returns[i, 0]", "lengths[i, 1] = lengths[i, 0]", "returns[i, 0] = 0.0",
                         "lengths[i, 0] = 0", "user_reset(state, obs, rng[i])")
                    self._leaf_checks(code, nleaves)
                    code("if c == 0:", "    c = 1")
                code("failed += 1 if c < 0 else 0", "ends += c if c > 0 else 0")
            code("return ends, failed")

        self._step_drivers(code, step_args)
        code("", "", "@njit(cache=True, nogil=True, _nrt=False)")
        with code.block(f"def reset_all({', '.join(self.reset_args())}):"):
            code("# reset every copy (seeding copy i with seed + i when seeded); returns the number of bad copies",
                 "n = rewards.shape[0]", "failed = 0")
            with code.block("for i in range(n):"):
                code("if seeded:", "    seed_rng(rng[i], seed + i)", "rewards[i] = 0.0", "terminals[i] = False",
                     "truncations[i] = False", "returns[i, 0] = 0.0", "lengths[i, 0] = 0",
                     f"state = {self._state_expr()}", f"obs = {self._obs_expr()}", "user_reset(state, obs, rng[i])",
                     "c = 0")
                self._leaf_checks(code, nleaves)
                code("failed += 1 if c < 0 else 0")
            code("return failed")
        return code.text()


# ---------------------------------------------------------------- loading the generated module

def _fingerprint(fn: Dispatcher) -> bytes:
    """What a user kernel's compiled code depends on: its module's whole source file (so its helpers
    count too), the source of every other module whose jitted functions it can reach (``_helper_sources``),
    its name, and the values it closes over."""
    py = fn.py_func
    parts = [py.__module__.encode(), py.__qualname__.encode(), _source_bytes(py), *_helper_sources(py)]
    for cell in py.__closure__ or ():
        parts.append(repr(cell.cell_contents).encode())
    return b"\0".join(parts)


def _source_bytes(py: Any) -> bytes:
    try:
        return Path(inspect.getsourcefile(py)).read_bytes()
    except (TypeError, OSError):
        return py.__code__.co_code + repr(py.__code__.co_consts).encode()


def _helper_sources(py: Any) -> list[bytes]:
    """The source of each module, other than ``py``'s own, that holds a jitted function reachable from ``py``'s
    module through module globals (helpers imported from elsewhere, and theirs): Numba's disk cache keys a
    function on its own file only, so an edited helper module must change the generated module's name."""
    seen, found, todo = {py.__module__}, {}, [py.__globals__]
    while todo:
        for value in list(todo.pop().values()):
            inner = getattr(value, "py_func", None) if isinstance(value, Dispatcher) else None
            if inner is not None and inner.__module__ not in seen:
                seen.add(inner.__module__)
                found[inner.__module__] = _source_bytes(inner)
                todo.append(inner.__globals__)
    return [name.encode() + b"\0" + found[name] for name in sorted(found)]


def load_kernels(source: KernelSource, inline: bool = True) -> Any:
    """Import (writing it first if new) the generated module of ``source`` and give it the user kernels.

    ``inline``: the user's reset and step are re-jitted with ``inline="always"`` so that Numba
    merges them into the reference-count-free loop (about 2x faster on CartPole); kernels that
    allocate arrays cannot run there, so the caller retries with ``inline=False``."""
    text = source.source()
    digest = hashlib.sha256(text.encode() + (b"inline" if inline else b"call"))
    for fn in (source.env.reset, source.env.step):
        digest.update(_fingerprint(fn))
    for name, arr in source.constants.items():
        digest.update(name.encode() + arr.dtype.str.encode() + repr(arr.shape).encode() + arr.tobytes())
    here = Path(__file__).resolve().parent
    for dep in ("numba_env.py", "rng.py", "kernel_types.py"):
        digest.update((here / dep).read_bytes())
    slug = "".join(ch if ch.isalnum() else "_" for ch in source.env.name)
    modname = f"packrl_kernel_{slug}_{digest.hexdigest()[:16]}"
    if modname in sys.modules:  # made ready by another env of this process
        return sys.modules[modname]
    module = import_generated(modname, text)
    if inline:
        module.user_reset = njit(inline="always")(source.env.reset.py_func)
        module.user_step = njit(inline="always")(source.env.step.py_func)
    else:
        module.user_reset, module.user_step = source.env.reset, source.env.step
    for name, arr in source.constants.items():
        setattr(module, name, arr)
    return module


@dataclass(frozen=True)
class CompileRecord:
    """One kernel made ready: how long it took and whether it came from Numba's disk cache."""

    kernel: str
    seconds: float
    source: str  # "compiled", "cache" (loaded from disk) or "memory" (already loaded in this process)

    def __str__(self) -> str:
        how = {"cache": "loaded from cache", "memory": "already in memory"}.get(self.source, "compiled")
        return f"{self.kernel}: {how} in {self.seconds:.2f}s"


def compile_kernel(env_name: str, dispatcher: Dispatcher, args: tuple) -> CompileRecord:
    """Compile (or load from the disk cache) ``dispatcher`` for the types of ``args``."""
    sig = tuple(numba.typeof(a) for a in args)
    if sig in dispatcher.overloads:  # another env of this process made it ready already
        return CompileRecord(dispatcher.__name__, 0.0, "memory")
    hits = sum(dispatcher.stats.cache_hits.values())
    start = time.perf_counter()
    try:
        dispatcher.compile(sig)
    except numba_errors.NumbaError as err:
        lines = str(err).strip().splitlines()
        ours = [line[line.index("step must return"):] for line in lines if "step must return" in line]
        short = "\n".join(lines[:40]) + ("\n..." if len(lines) > 40 else "")
        headline = ours[0] if ours else f"its kernels do not compile ({type(err).__name__})"
        raise EnvError(f"numba env {env_name!r}: {headline}\n{short}") from None
    seconds = time.perf_counter() - start
    loaded = sum(dispatcher.stats.cache_hits.values()) > hits
    return CompileRecord(dispatcher.__name__, seconds, "cache" if loaded else "compiled")


# ---------------------------------------------------------------- the batched env

class BatchedNumbaEnv(NoEnvObjects, gymnasium.vector.VectorEnv):
    """``num_envs`` copies of a :class:`NumbaEnv`, stepped by one compiled call.

    Follows packrl's env protocol with ``autoreset = True``: a copy whose episode ends is reset
    inside the same ``step``; ``final_observations`` holds its last observation and
    ``infos["episode_return"]`` / ``infos["episode_length"]`` its return and length (both valid
    at the rows where ``terminals | truncations``; the arrays are reused, copy what you keep).
    ``threads``: None picks a serial loop below :data:`PARALLEL_MIN_ENVS` copies and, above, whichever of
    the serial loop and all Numba threads steps faster on this machine now (timed while it runs,
    ``thread_choice``); 1 forces serial; k > 1 runs ``prange`` on k threads.
    ``episode_infos``: when True, a step where episodes ended returns ``infos`` with
    ``episode_index``, ``episode_return`` and ``episode_length`` of those copies (off by default: it
    costs a few microseconds per step, as much as stepping 64 CartPoles). The same numbers are
    always in ``episode_returns`` / ``episode_lengths`` (rows where ``terminals | truncations``).
    ``async_reset``/``send``/``recv`` are there for code written against vector envs, and it is a
    ``gymnasium.vector.VectorEnv`` (same-step autoreset).
    """

    autoreset = True
    metadata = {"autoreset_mode": SAME_STEP}

    def __init__(self, env: NumbaEnv, num_envs: int, seed: int = 0, threads: int | None = None,
                 episode_infos: bool = False, max_episode_steps: int | None = None):
        if not isinstance(env, NumbaEnv):
            raise EnvError(f"BatchedNumbaEnv takes a NumbaEnv, got {type(env).__name__}")
        if env.agents and type(self) is BatchedNumbaEnv:
            raise EnvError(f"numba env {env.name!r} has agents {list(env.agents)}: use packrl.envs.make or "
                           "packrl.envs.numba_agents.BatchedNumbaAgents")
        env = with_time_limit(env, max_episode_steps)
        if int(num_envs) < 1:
            raise EnvError(f"numba env {env.name!r}: num_envs must be >= 1, got {num_envs}")
        self.numba_env, self.name = env, env.name
        self.num_envs = self.num_agents = n = int(num_envs)
        self.seed = int(seed)
        self.episode_infos = bool(episode_infos)
        self.possible_agents = self.agents = tuple(f"env_{i}" for i in range(n))
        self.emulated = _all_rows(group_agents(("env_0",), {"env_0": env.observation_space}, {"env_0": env.action_space}), n)
        layout, action = self.emulated.observation, self.emulated.action
        self.passthrough, self.single_observation_space, obs_shape, obs_dtype = row_format(self.emulated)
        self.single_action_space = action.policy_space
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self.closed = False
        self._setup_kernels(KernelSource(env, layout, action, self.passthrough), threads)

        self.observations = np.zeros((n, *obs_shape), obs_dtype)
        self.final_observations = np.zeros_like(self.observations)
        self.rewards = np.zeros(n, np.float32)
        self.terminals = np.zeros(n, bool)
        self.truncations = np.zeros(n, bool)
        self.masks = np.ones(n, bool)
        self.state = {key: np.zeros((n, *_as_shape(shape)), np.dtype(dtype)) for key, (shape, dtype) in env.state.items()}
        self.rng = np.zeros((n, RNG_WORDS), np.uint64)
        self._returns = np.zeros((n, 2), np.float64)  # [running, of the episode that just ended]
        self._lengths = np.zeros((n, 2), np.int64)
        self._bad = np.full(n, -1, np.int64)
        self._seeded = False
        self._module = None
        self._bind()
        self.compile_records = self._compile()

    # ------------------------------------------------------------ construction

    def _choose_threads(self, threads: int | None) -> int:
        if threads is None:
            return numba.config.NUMBA_NUM_THREADS if self.num_agents >= PARALLEL_MIN_ENVS else 1
        if int(threads) < 1:
            raise EnvError(f"numba env {self.name!r}: threads must be None or >= 1, got {threads}")
        return min(int(threads), numba.config.NUMBA_NUM_THREADS)

    @property
    def action_shapes(self) -> list[tuple[tuple[int, ...], np.dtype]]:
        """Each action array's per-row shape and dtype, in the kernel's policy-facing form (two for a hybrid)."""
        return self._action_shapes

    def _setup_kernels(self, source: KernelSource, threads: int | None) -> None:
        """The action arrays' shapes and dtypes, the kernels' source and the threads (``num_agents`` rows)."""
        action = source.action
        self._action_kind = action.kind
        self._action_shapes = self._policy_shapes(action)
        single = action.kind != "hybrid"
        self._fast_dtype = self._action_shapes[0][1] if single else None
        self._fast_shape = (self.num_agents, *self._action_shapes[0][0]) if single else None
        self._source = source
        self.threads = self._choose_threads(threads)
        self.thread_choice = ThreadChoice(self.threads) if threads is None and self.threads > 1 else None

    @staticmethod
    def _policy_shapes(action: ActionLayout) -> tuple:
        if action.kind == "discrete":
            return ((), np.dtype(np.int64)),
        if action.kind == "multidiscrete":
            return ((action.num_discrete,), np.dtype(np.int64)),
        if action.kind == "continuous":
            return (tuple(action.policy_space.shape), np.dtype(action.policy_space.dtype)),
        return (((action.num_discrete,), np.dtype(np.int64)),
                ((action.num_continuous,), np.dtype(action.continuous_dtype)))

    def _bind(self) -> None:
        """Per-leaf typed views of the observation rows, and the argument tuples of the kernels."""
        n, layout = self.num_envs, self.emulated.observation
        if self.passthrough:
            leaves = [self.observations.reshape(n, -1) if self.observations.ndim == 1 else self.observations]
        else:
            leaves = [self.observations[:, leaf.offset: leaf.offset + leaf.nbytes].view(leaf.dtype).reshape((n, *(leaf.shape or (1,))))
                      for leaf in layout.leaves]
        self.leaf_views = dict(zip((c.field for c in self._source.checks), leaves))
        buffers = (self.observations, *leaves, self.final_observations, self.rng, self.rewards, self.terminals,
                   self.truncations, self._returns, self._lengths, self._bad)
        self._step_tail = (*self.state.values(), *buffers)
        self._reset_tail = self._step_tail
        self.episode_returns, self.episode_lengths = self._returns[:, 1], self._lengths[:, 1]

    def _compile(self) -> list[CompileRecord]:
        """Inlined user kernels first; called ones when those do not compile (e.g. they allocate)."""
        if getattr(self, "_module", None) is not None:
            return self._compile_module(self._module)
        try:
            self._module = load_kernels(self._source, inline=True)
            return self._compile_module(self._module)
        except EnvError:
            self._module = load_kernels(self._source, inline=False)
            self._bind()
            return self._compile_module(self._module)

    def _compile_module(self, m: Any) -> list[CompileRecord]:
        # chunks per thread: a few, so a slow chunk does not hold the others up
        self._parallel_tail = (*self._step_tail, np.int64(4 * self.threads))
        dummy = tuple(np.zeros((self.num_agents, *shape), dtype) for shape, dtype in self._action_shapes)
        records = []
        if self.threads == 1 or self.thread_choice is not None:
            records.append(compile_kernel(self.name, m.step_serial, (*dummy, *self._step_tail)))
        if self.threads > 1:
            records.append(compile_kernel(self.name, m.step_parallel, (*dummy, *self._parallel_tail)))
        records.append(compile_kernel(self.name, m.reset_all, (np.int64(0), False, *self._reset_tail)))
        self._serial_kernel, self._parallel_kernel, self._reset_kernel = m.step_serial, m.step_parallel, m.reset_all
        return records

    @property
    def compile_report(self) -> str:
        """One line: how each kernel was made ready in this process."""
        how = "serial" if self.threads == 1 else f"{self.threads} threads"
        how = f"serial or {self.threads} threads, timed" if self.thread_choice is not None else how
        return f"numba env {self.name!r} x{self.num_envs} ({how}): " \
            + "; ".join(str(r) for r in self.compile_records)

    # ------------------------------------------------------------ protocol

    def set_buffers(self, observations: np.ndarray, final_observations: np.ndarray, rewards: np.ndarray,
                    terminals: np.ndarray, truncations: np.ndarray, masks: np.ndarray) -> None:
        """Write into arrays owned by someone else (a vector backend's shared memory)."""
        wanted = {"observations": (self.observations, observations), "final_observations": (self.final_observations, final_observations),
                  "rewards": (self.rewards, rewards), "terminals": (self.terminals, terminals),
                  "truncations": (self.truncations, truncations), "masks": (self.masks, masks)}
        for name, (mine, theirs) in wanted.items():
            if not isinstance(theirs, np.ndarray) or theirs.shape != mine.shape or theirs.dtype != mine.dtype:
                got = f"{theirs.dtype} {theirs.shape}" if isinstance(theirs, np.ndarray) else type(theirs).__name__
                raise EnvError(f"numba env {self.name!r}: set_buffers {name} must be {mine.dtype} {mine.shape}, got {got}")
            if not theirs.flags.c_contiguous or not theirs.flags.writeable:
                raise EnvError(f"numba env {self.name!r}: set_buffers {name} must be a writeable C-contiguous array")
            theirs[...] = mine
        self.observations, self.final_observations = observations, final_observations
        self.rewards, self.terminals, self.truncations, self.masks = rewards, terminals, truncations, masks
        self.masks[:] = True
        self._bind()
        # shared-memory arrays type like ours, so this only loads what _compile already made
        self.compile_records = self._compile()

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Reset every copy. ``seed`` seeds copy j with ``seed + j``; None seeds with the
        constructor's seed on the first reset and continues the streams afterwards."""
        self._check_open()
        seeded = seed is not None or not self._seeded
        base = self.seed if seed is None else int(seed)
        failed = self._reset_kernel(np.int64(base), seeded, *self._reset_tail)
        self._seeded = True
        if failed:
            self._raise_leaf_error("reset")
        return self.observations, {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Step every copy with its action (policy-facing form, a leading num_envs axis); copies
        whose episode ends are reset in the same call."""
        if self.closed:
            self._check_open()
        # fast path: an array already in the kernel's dtype and shape (``is``: builtin dtypes are singletons)
        if (type(actions) is np.ndarray and actions.dtype is self._fast_dtype and actions.shape == self._fast_shape
                and actions.flags.c_contiguous):
            acts = (actions,)
        else:
            acts = self._actions(actions)
        if self._check_actions(*acts) >= 0:
            self._refuse_actions(acts)
        code = self._run_step(acts)
        if code < 0:
            self._raise_leaf_error("step")
        infos = self._episode_infos() if code > 0 and self.episode_infos else {}
        return self.observations, self.rewards, self.terminals, self.truncations, infos

    def _run_step(self, acts: tuple) -> int:
        """One call of the step kernel: the serial loop, the threaded one, or (``threads=None`` on a large batch)
        the one ``thread_choice`` picks, timed for it."""
        choice = self.thread_choice
        kernel = self.threads if choice is None else choice.pick()
        if kernel == SERIAL:
            if choice is None:
                return self._serial_kernel(*acts, *self._step_tail)
            start = time.perf_counter()
            code = self._serial_kernel(*acts, *self._step_tail)
        else:
            if numba.get_num_threads() != kernel:
                numba.set_num_threads(kernel)
            if choice is None:
                return self._parallel_kernel(*acts, *self._parallel_tail)
            start = time.perf_counter()
            code = self._parallel_kernel(*acts, *self._parallel_tail)
        choice.record(kernel, time.perf_counter() - start)
        return code

    def _episode_infos(self) -> dict:
        index = np.flatnonzero(self.terminals | self.truncations)
        return {"episode_index": index, "episode_return": self.episode_returns[index],
                "episode_length": self.episode_lengths[index]}

    # ------------------------------------------------------------ the vector-env batch interface

    def async_reset(self, seed: int | None = None) -> None:
        """Reset now; ``recv`` returns the result."""
        self.reset(seed)
        self._pending = {}

    def send(self, actions: Any) -> None:
        """Step now; ``recv`` returns the result."""
        self._pending = self.step(actions)[4]

    def recv(self) -> Any:
        """The last reset or step as a batch of every copy (infos: one dict per copy)."""
        self._check_open()
        infos: list = [{} for _ in range(self.num_envs)]
        info = getattr(self, "_pending", {})
        for k, i in enumerate(info.get("episode_index", ())):
            infos[i] = {"episode_return": info["episode_return"][k], "episode_length": info["episode_length"][k]}
        return Batch(self.observations, self.rewards, self.terminals, self.truncations, infos,
                          np.arange(self.num_envs), self.masks, self.final_observations)

    # ------------------------------------------------------------ actions and errors

    def _actions(self, actions: Any) -> tuple:
        if self._action_kind == "hybrid":
            if not isinstance(actions, dict) or set(actions) != {"discrete", "continuous"}:
                raise EmulationError(f"numba env {self.name!r}: hybrid actions must be a dict with 'discrete' and "
                                     f"'continuous' arrays, got {type(actions).__name__}")
            return (self._action_array(actions["discrete"], *self._action_shapes[0], "discrete"),
                    self._action_array(actions["continuous"], *self._action_shapes[1], "continuous"))
        return (self._action_array(actions, *self._action_shapes[0], self._action_kind),)

    def _action_array(self, value: Any, shape: tuple, dtype: np.dtype, part: str) -> np.ndarray:
        arr = value if type(value) is np.ndarray else np.asarray(value)
        want = (self.num_agents, *shape)
        if arr.shape != want:
            if arr.size == int(np.prod(want)) and arr.ndim and arr.shape[0] == self.num_agents:
                arr = arr.reshape(want)  # (n, 1) discrete actions, as some policies emit them
            else:
                raise EmulationError(f"numba env {self.name!r}: {part} actions must have shape {want}, got {arr.shape}")
        if arr.dtype != dtype:
            if dtype.kind == "i" and arr.dtype.kind not in "iu":
                raise EmulationError(f"numba env {self.name!r}: {part} actions must be integers, got dtype {arr.dtype}")
            if dtype.kind == "f" and arr.dtype.kind != "f":
                raise EmulationError(f"numba env {self.name!r}: {part} actions must be floats, got dtype {arr.dtype}")
            if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
                raise EmulationError(f"numba env {self.name!r}: {part} action {arr.max()} does not fit int64")
            arr = arr.astype(dtype)  # integer widths are exact; floats go to the Box's own dtype, as decode does
        return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)

    def _check_actions(self, *acts: np.ndarray) -> int:
        """The first copy whose action is outside the space, or -1: packrl's one action checker
        (``ActionLayout.check_batch``, one C call) on the kernel's action arrays."""
        action = self.emulated.action
        if len(acts) == 2:
            return action.check_batch(*acts)
        return action.check_batch(None, acts[0]) if action.kind == "continuous" else action.check_batch(acts[0], None)

    def _refuse_actions(self, acts: tuple) -> None:
        i = self._check_actions(*acts)
        action = acts[0][i] if len(acts) == 1 else {"discrete": acts[0][i], "continuous": acts[1][i]}
        layout = self.emulated.action
        bounds = f"choices in [0, n) with n={layout.nvec.tolist()}" if layout.num_discrete else ""
        if layout.num_continuous:
            bounds += (" and " if bounds else "") + f"continuous values in [{layout.low.tolist()}, {layout.high.tolist()}]"
        raise EmulationError(f"numba env {self.name!r}, env index {i}: action {np.asarray(action).tolist()} is "
                             f"outside the action space ({bounds}); no copy was stepped")

    def _raise_leaf_error(self, phase: str) -> None:
        rows = np.flatnonzero(self._bad >= 0)
        i = int(rows[0])
        code = int(self._bad[i])
        self._bad[rows] = -1
        nleaves = len(self._source.checks)
        where = "reset (after an episode ended)" if (phase == "step" and code >= nleaves) else phase
        check = self._source.checks[code % nleaves]
        what = leaf_problem(check, self.leaf_views[check.field][i])
        others = f"; {len(rows) - 1} other copies failed too" if len(rows) > 1 else ""
        raise EnvError(f"numba env {self.name!r}, env index {i}: its {where} kernel wrote {what} into observation leaf "
                       f"{check.leaf.name!r} ({check.leaf.space}){others}. Other copies' rows are intact.",
                       env_index=i)

    # ------------------------------------------------------------ misc

    def close_extras(self, **kwargs: Any) -> None:
        """Nothing to release: the buffers are plain arrays (``close`` marks the env closed)."""

    def _check_open(self) -> None:
        if self.closed:
            raise EnvError(f"numba env {self.name!r}: the vector env is closed")

    def __repr__(self) -> str:
        return f"BatchedNumbaEnv({self.name!r}, num_envs={self.num_envs}, threads={self.threads})"


def with_time_limit(env: NumbaEnv, max_episode_steps: Any) -> NumbaEnv:
    """``env`` with its time limit replaced by ``max_episode_steps`` (None: kept), as gymnasium.make's argument."""
    if max_episode_steps is None:
        return env
    if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, (int, np.integer)) or max_episode_steps < 1:
        raise UsageError(f"numba env {env.name!r}: max_episode_steps must be an int >= 1, got {max_episode_steps!r}")
    return replace(env, max_episode_steps=int(max_episode_steps))


def leaf_problem(check: LeafCheck, value: np.ndarray) -> str:
    """What is wrong with one copy's (or agent's) ``value`` of a checked leaf: NaN, or the first value out of range."""
    if check.kind == "nan":
        return "NaN"
    outside = (value < check.low) | (value > check.high)
    what = f"value {value[outside].reshape(-1)[0]} outside {check.describe()}"
    if value.dtype.kind == "i" and value[outside].reshape(-1)[0] == np.iinfo(value.dtype).min:
        what += " (the integer a NaN becomes when written into an integer array)"
    return what


def _all_rows(one: Emulated, n: int) -> Emulated:
    """The single-row layouts of ``one`` shared by ``n`` rows named env_0 .. env_{n-1} (built once,
    not once per copy: all copies have the same spaces)."""
    agents = tuple(f"env_{i}" for i in range(n))
    group = replace(one.groups[0], agents=agents, rows=tuple(range(n)))
    return Emulated(agents, (group,), (0,) * n)

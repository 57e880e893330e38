"""MPE's world physics (mpe2's ``core.World``), shared by packrl's Numba ports of MPE envs: the force of a
Discrete(5) action, the softened contact force between two discs, and the damped integration step. Float64, in
mpe2's order of operations: the ports are compared with mpe2 transition by transition."""
from __future__ import annotations

import numpy as np
from numba import njit

DT = 0.1
DAMPING = 0.25
CONTACT_FORCE = 1e2
CONTACT_MARGIN = 1e-3


@njit(cache=True)
def logaddexp0(x: float) -> float:
    """log(1 + exp(x)) as np.logaddexp(0, x) computes it."""
    return max(x, 0.0) + np.log1p(np.exp(-abs(x)))


@njit(cache=True)
def action_force(force: np.ndarray, a: int, action: int, accel: float) -> None:
    """Agent ``a``'s force from its action: 0 none, 1 -x, 2 +x, 3 -y, 4 +y, of size ``accel``."""
    force[a, 0], force[a, 1] = 0.0, 0.0
    if action == 1:
        force[a, 0] = -accel
    elif action == 2:
        force[a, 0] = accel
    elif action == 3:
        force[a, 1] = -accel
    elif action == 4:
        force[a, 1] = accel


@njit(cache=True)
def contact_push(pos: np.ndarray, a: int, bx: float, by: float, reach: float) -> tuple:
    """The contact force on agent ``a`` from a disc at (bx, by) within ``reach`` (the sum of the radii)."""
    dx, dy = pos[a, 0] - bx, pos[a, 1] - by
    dist = np.sqrt(dx * dx + dy * dy)
    penetration = logaddexp0(-(dist - reach) / CONTACT_MARGIN) * CONTACT_MARGIN
    return CONTACT_FORCE * dx / dist * penetration, CONTACT_FORCE * dy / dist * penetration


@njit(cache=True)
def integrate(pos: np.ndarray, vel: np.ndarray, force: np.ndarray, a: int) -> None:
    """Agent ``a`` moves by its velocity, which is damped, then takes its force (mass 1)."""
    for d in range(2):
        pos[a, d] += vel[a, d] * DT
        vel[a, d] = vel[a, d] * (1 - DAMPING)
        vel[a, d] += force[a, d] * DT

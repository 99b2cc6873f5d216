"""`--engine sim`, resolved where the commands build an engine: the simulated runner lives in
baton.loadtest, which the engine and worker packages do not import, so the command hands it in."""
from __future__ import annotations

from typing import TYPE_CHECKING

from baton.services.engine.config import EngineConfig

if TYPE_CHECKING:
    from baton.services.engine.runner import SimRunnerFactory


def sim_runner_for(config: EngineConfig) -> SimRunnerFactory | None:
    """What builds the engine's runner under engine=sim; None for the model engine."""
    if config.engine != "sim":
        return None
    from baton.loadtest.sim.runner import SimulatedRunner  # torch: only once a command runs one

    return SimulatedRunner

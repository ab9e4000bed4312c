"""The GLM-5 SIMULATION's landscape for ``glm5-modelled-only.yaml`` (a bound experiment): the
same function, with nothing left unmodelled because the space keeps only modelled parameters."""

from benchmarks.landscapes.glm5 import COST_MINUTES, NOISE, landscape

NOT_MODELLED: tuple[str, ...] = ()

__all__ = ["COST_MINUTES", "NOISE", "NOT_MODELLED", "landscape"]

"""Parallelism planning for DeepSeek-V4 training: pipeline layout and recompute from measured layer costs.

How the pieces feed each other: layer profiles in the database (``profiles``), else the ones
shipped with the package (``packaged``, written by ``tuner profile export``), become per-layer
costs (``costs``: layer costs, stage extras, the calibration's stated constants, the memory
model); each (pp, vpp) the cluster allows (``parallel``) turns them into an iteration model
(``iteration``), which prices one plan with the schedule simulator (``schedule``) and layouts
(``layout``); ``search`` finds the best plans over all of them; ``request`` is what ``tuner plan``
runs (the request resolved once into ``Resolved``, node sweeps, staleness, storing the plan)
and ``report`` draws it.
"""

from tuner.plan.costs import Calibration, LayerCost, MemoryModel, ProfiledCosts, StageExtras
from tuner.plan.iteration import IterationModel, Plan, PlanInputs, predict
from tuner.plan.search import NoPlanFits, SearchResult

# the search function stays at tuner.plan.search.search: re-exported here it would hide its module
__all__ = [
    "Calibration", "IterationModel", "LayerCost", "MemoryModel", "NoPlanFits", "Plan", "PlanInputs",
    "ProfiledCosts", "SearchResult", "StageExtras", "predict",
]

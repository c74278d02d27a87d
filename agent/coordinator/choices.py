"""The planner's named choices and defaults: Faro's objectives, latency estimators and
solver methods, Ribbon's sizing methods.

Kept apart from the solvers (numpy, numba, scipy) so that the coordinator's config
declaration and the CLI's flags name them without importing one: ``--help`` stays fast,
and faro and ribbon check their arguments against the same tuples.
"""

from __future__ import annotations

OBJECTIVES = ("sum", "fair", "fairsum", "penaltysum", "penaltyfairsum")
ESTIMATORS = ("mdc", "upper")
#: Utilisation above which the relaxed latency estimate is used (faro.latency).
RHO_MAX = 0.95
#: The quantile of the forecast window a plan is made for, not its mean.
DEFAULT_RATE_QUANTILE = 0.9
#: Faro's solvers (faro.solver).
METHODS = ("auto", "fast", "cobyla", "cobyla-hierarchical", "exhaustive")
#: Ribbon's search methods (ribbon.search) and how many pools it evaluates by default.
SIZE_METHODS = ("bo", "random", "exhaustive")
SIZE_MAX_SAMPLES = 100

"""The one error type of the workload generators: bad input, said plainly."""

from __future__ import annotations


class WorkloadError(ValueError):
    """Input a workload cannot be built from; the message names file, row and column."""

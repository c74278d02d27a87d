"""Model-inference workloads derived from function invocation counts (CremeBrulee §VI-A).

Read the Azure Functions 2019 trace (``read_azure_invocations``) or make a synthetic one
in the same shape (``synthetic_invocations``), then ``build_workload`` turns a window of
it into a request trace and model profiles the simulator reads (``write_trace``,
``write_profiles``), a share of the functions firing as timers where asked
(``timer_events``).
"""

from cachepolicies.workloads.association import ASSOCIATIONS, associate
from cachepolicies.workloads.azure import (
    HTTP_TRIGGER,
    ID_COLUMNS,
    read_azure_invocations,
    write_azure_invocations,
)
from cachepolicies.workloads.errors import WorkloadError
from cachepolicies.workloads.events import spread_over_minutes
from cachepolicies.workloads.files import write_profiles, write_trace
from cachepolicies.workloads.invocations import InvocationCounts
from cachepolicies.workloads.popularity import PopularityFilter, filter_by_popularity
from cachepolicies.workloads.synthetic import TRIGGER_SHARES, synthetic_invocations
from cachepolicies.workloads.timers import timer_events
from cachepolicies.workloads.trace import NAMINGS, TraceOptions, Workload, build_workload

__all__ = [
    "ASSOCIATIONS",
    "HTTP_TRIGGER",
    "ID_COLUMNS",
    "NAMINGS",
    "TRIGGER_SHARES",
    "InvocationCounts",
    "PopularityFilter",
    "TraceOptions",
    "Workload",
    "WorkloadError",
    "associate",
    "build_workload",
    "filter_by_popularity",
    "read_azure_invocations",
    "spread_over_minutes",
    "synthetic_invocations",
    "timer_events",
    "write_azure_invocations",
    "write_profiles",
    "write_trace",
]

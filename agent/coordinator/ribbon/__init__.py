"""Fleet sizing (Ribbon, SC'21): the cheapest mix of instance types that meets QoS.

``space``: the search space and Ribbon's objective; ``evaluators``: what a configuration
costs and serves (the lookup-grid evaluator); ``fleet``: the live-fleet evaluator (a pool
scored by Faro's allocator and M/D/c); ``search``: Bayesian optimisation with
active pruning, and the random and exhaustive baselines
(``from agent.coordinator.ribbon.search import search``); ``synthetic``: generated grids
for tests and benches. This layer imports no node code.
"""

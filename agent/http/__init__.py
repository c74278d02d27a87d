"""HTTP plumbing shared by the agent and the coordinator: bodies read within bounds,
the event loop and listener, the dashboard page and its files."""

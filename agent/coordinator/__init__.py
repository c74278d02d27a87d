"""The coordinator: decides, across a fleet of nodes, how much capacity each model gets."""

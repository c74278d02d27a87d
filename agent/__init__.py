"""edgeagent: node agent, backends, coordinator and CLI."""

__version__ = "0.1.0"

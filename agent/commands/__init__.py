"""The `edgeagent` subcommands, one module per command group."""

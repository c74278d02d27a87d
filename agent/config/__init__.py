"""The agent's configuration and a model's ``config.yaml``, each declared once: a
model's in ``modelconfig``, the agent's in ``agentconfig`` (this face hands on what the
rest of the code imports; both are declared with ``agent.schema``), the twin's settings
in ``twinsettings``. An unknown key or a bad value is a ``ConfigError`` naming
the file and the dotted key, e.g. ``models/resnet/config.yaml: slo.latency_ms: must be a
number > 0, got 'fast'``."""

from agent.config.agentconfig import (NODE_NAME_VARIABLE, AgentConfig, CoordinatorLink,
                                      RoutingSettings, TfServingSettings, TracingSettings,
                                      load_agent_config, parse_agent_config)
from agent.config.modelconfig import (BACKENDS, ClassifierOptions, DeclaredTensor,
                                      ModelConfig, SloOptions, SyntheticOptions,
                                      load_model_config, parse_model_config,
                                      version_digest)
from agent.validation import ConfigError

__all__ = ["AgentConfig", "BACKENDS", "ClassifierOptions", "ConfigError", "CoordinatorLink",
           "DeclaredTensor", "ModelConfig", "NODE_NAME_VARIABLE", "RoutingSettings",
           "SloOptions", "SyntheticOptions", "TfServingSettings", "TracingSettings",
           "load_agent_config", "load_model_config",
           "parse_agent_config", "parse_model_config", "version_digest"]

"""The node agent: model repository, backends driver, model cache and HTTP APIs."""

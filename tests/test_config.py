"""config.yaml and agent config parsing: defaults, and errors that name file and key."""

import pytest

from agent.config import (AgentConfig, ConfigError, SloOptions, load_agent_config,
                          load_model_config, parse_model_config)
from agent.node.repository import scan_repository
from tests.helpers import add_mlp, add_synthetic


def test_model_config_full(tmp_path):
    f = tmp_path / "config.yaml"
    f.write_text("backend: onnx\ndevice: cuda\nslo: {latency_ms: 20, percentile: 95}\n"
                 "max_batch_size: 8\npin: true\n"
                 "onnxruntime: {intra_op_threads: 2, graph_optimization_level: basic}\n")
    cfg = load_model_config(f)
    assert (cfg.backend, cfg.device, cfg.slo) == ("onnx", "cuda:0", SloOptions(20, 95))
    assert cfg.max_batch_size == 8 and cfg.pin
    assert cfg.onnxruntime.intra_op_threads == 2
    assert cfg.onnxruntime.graph_optimization_level == "basic"


@pytest.mark.parametrize("text, key, words", [
    ("colour: red\n", "colour", "unknown key"),
    ("slo: {latency_ms: fast}\n", "slo.latency_ms", "number > 0"),
    ("slo: {percentile: 99}\n", "slo.latency_ms", "required"),
    ("device: tpu\n", "device", "cpu, cuda"),
    ("backend: torch\n", "backend", "one of onnx, tfserving, synthetic"),
    ("max_batch_size: -1\n", "max_batch_size", ">= 0"),
    ("pin: maybe\n", "pin", "true or false"),
    ("onnxruntime: {threads: 2}\n", "onnxruntime.threads", "unknown key"),
    ("backend: synthetic\nsynthetic: {size_bytes: lots}\n", "synthetic.size_bytes", "bad size"),
    ("backend: onnx\nsynthetic: {base_ms: 1}\n", "synthetic", "only allowed"),
    ("[1, 2\n", None, "invalid YAML"),
    ("- 1\n", None, "must be a mapping"),
])
def test_model_config_errors_name_file_and_key(tmp_path, text, key, words):
    f = tmp_path / "config.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_model_config(f)
    msg = str(err.value)
    assert str(f) in msg and words in msg
    if key:
        assert f": {key}: " in msg


def test_synthetic_sizes_accept_units():
    cfg = parse_model_config({"backend": "synthetic", "synthetic": {"size_bytes": "2MiB"}})
    assert cfg.synthetic.size_bytes == 2 * 2**20


def test_agent_config(tmp_path):
    f = tmp_path / "agent.yaml"
    f.write_text("port: 9001\nrepository: models\ncpu_budget: 512MB\npolicy: lru\n")
    cfg = load_agent_config(f)
    assert cfg.port == 9001 and cfg.cpu_budget == 512_000_000 and cfg.policy == "lru"
    assert cfg.repository == (tmp_path / "models").resolve()
    assert cfg.with_overrides(port=1, policy=None).port == 1
    assert AgentConfig().policy == "cremebrulee-forecast"


@pytest.mark.parametrize("text, key", [("prot: 1\n", "prot"), ("port: 70000\n", "port"),
                                       ("policy: fifo\n", "policy"),
                                       ("cpu_budget: 1XB\n", "cpu_budget")])
def test_agent_config_errors(tmp_path, text, key):
    f = tmp_path / "agent.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=f"{f}: {key}: "):
        load_agent_config(f)


def test_repository_scan(repo):
    add_mlp(repo, "a", version=1)
    add_mlp(repo, "a", version=3, seed=5)
    add_synthetic(repo, "s")
    (repo / "bad").mkdir()
    (repo / "bad" / "config.yaml").write_text("colour: red\n")
    (repo / "empty").mkdir()
    models = scan_repository(repo)
    assert models["a"].versions == (1, 3) and models["a"].default_version == 3
    assert models["a"].backend == "onnx" and models["a"].error is None
    assert models["s"].backend == "synthetic" and models["s"].versions == (1,)
    assert "colour" in models["bad"].error and "config.yaml" in models["bad"].error
    assert "no version directory" in models["empty"].error


@pytest.mark.parametrize("text, said", [
    ("prot: 1\n", "prot: unknown key (did you mean port?)"),
    ("reposit: models\n", "reposit: unknown key (did you mean repository?)"),
    ("batching: {windw_ms_max: 5}\n", "batching.windw_ms_max: unknown key (did you mean "
                                      "window_ms_max?)"),
    ("colour: red\n", "colour: unknown key (none of the {n} keys here is close; "
                      "`edgeagent config example` lists them)"),
    ("tls: {cert_file: a, key_file: b, colour: red}\n",  # a few: all listed
     "tls.colour: unknown key (expected one of: cert_file, key_file, client_ca_file, "
     "client_auth, min_version)"),
])
def test_a_mistyped_key_gets_the_nearest_one_not_every_key(tmp_path, text, said):
    """A typo names the key meant; no match lists the keys only where they are few."""
    f = tmp_path / "agent.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_agent_config(f)
    assert str(err.value) == f"{f}: {said.format(n=len(AgentConfig.__struct_fields__))}"

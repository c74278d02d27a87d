"""FootprintModel: tight learned estimates per backend and device, kept across restarts;
MemoryMeter windows."""

from __future__ import annotations

import json

import pytest

from agent.memory import FootprintModel, MemoryMeter, MiB, Prior

PRIOR = Prior(1.03, MiB // 2)


def test_prior_until_measured_then_tight():
    f = FootprintModel()
    assert f.estimate("onnx", 40 * MiB, prior=PRIOR) == int(MiB // 2 + 1.03 * 40 * MiB)
    for weights, excess in [(10, 0.3), (20, 0.1), (40, 0.2), (0.3, 0.5)]:
        f.observe("onnx", int(weights * MiB), int((weights + excess) * MiB))
    # overhead and factor fitted (0.1 MiB, ~1.02): within a few % of the truth, never the
    # 2x of a max-ratio upper bound.
    estimate = f.estimate("onnx", 50 * MiB, prior=PRIOR)
    assert 50.2 * MiB < estimate < 50.2 * MiB * 1.06
    small = f.estimate("onnx", MiB // 4, prior=PRIOR)
    assert small < MiB  # small models are mostly overhead, and it was learned


def test_factor_is_per_backend_and_device_and_never_below_one():
    f = FootprintModel()
    f.observe("onnx", 100 * MiB, 90 * MiB)  # RSS undercounted (reused heap): weights held
    assert f.factor("onnx") == 1.0
    f.observe("onnx", 100 * MiB, 300 * MiB, device="cuda:1")
    assert f.factor("onnx", "cuda:0") == pytest.approx(3.0)
    # A prior that expects a large overhead takes what the measurement leaves for it.
    big_overhead = Prior(1.0, 250 * MiB)
    assert f.learned("onnx", "cuda:0", big_overhead) == (1.0, 200 * MiB)
    assert f.factor("onnx", "cpu") == 1.0
    assert f.factor("tfserving", "cpu", Prior(4.0, 0)) == 4.0
    assert set(f.to_json()) == {"onnx/cpu", "onnx/cuda"}


def test_one_odd_small_measurement_does_not_set_the_overhead():
    f = FootprintModel()
    f.observe("onnx", 40_000, 8 * MiB)  # a first load that caught lazy start-up work
    assert f.learned("onnx", prior=PRIOR)[1] == MiB // 2  # the prior still holds it
    for _ in range(2):
        f.observe("onnx", 40_000, 40_000 + 200_000)
    assert f.learned("onnx", prior=PRIOR)[1] == 200_000


def test_a_high_quantile_ignores_one_outlier():
    f = FootprintModel()
    for _ in range(15):
        f.observe("onnx", 10 * MiB, 10 * MiB + 100_000)
    f.observe("onnx", 10 * MiB, 25 * MiB)  # one window that caught something else
    assert f.factor("onnx") < 1.05


def test_learned_factors_survive_a_restart(tmp_path):
    path = tmp_path / "state" / "footprints.json"
    f = FootprintModel.load(path)
    assert f.estimate("onnx", 10 * MiB, prior=PRIOR) == int(MiB // 2 + 1.03 * 10 * MiB)
    f.observe("onnx", 10 * MiB, 12 * MiB)
    f.observe("onnx", 20 * MiB, 26 * MiB, device="cuda:0")
    doc = json.loads(path.read_text())
    assert doc["measurements"]["onnx/cpu"] == [[10 * MiB, 12 * MiB]]
    assert not list(path.parent.glob(".*.tmp"))  # written atomically: temp file renamed
    again = FootprintModel.load(path)
    for device in ("cpu", "cuda:0"):
        assert again.estimate("onnx", 30 * MiB, device=device, prior=PRIOR) == \
            f.estimate("onnx", 30 * MiB, device=device, prior=PRIOR)


def test_an_unreadable_file_starts_fresh(tmp_path, caplog):
    path = tmp_path / "footprints.json"
    path.write_text("{not json")
    f = FootprintModel.load(path)
    assert f.to_json() == {} and "ignoring unreadable footprint file" in caplog.text
    f.observe("onnx", 10 * MiB, 11 * MiB)
    assert FootprintModel.load(path).to_json() == f.to_json()


def test_weight_bytes_are_read_once_per_file_version(tmp_path):
    file = tmp_path / "m.onnx"
    file.write_bytes(b"x" * 10)
    f, reads = FootprintModel(), []

    def read(path):
        reads.append(path)
        return path.stat().st_size

    assert f.weight_bytes(file, read) == f.weight_bytes(file, read) == 10 and len(reads) == 1
    file.write_bytes(b"x" * 20)
    assert f.weight_bytes(file, read) == 20 and len(reads) == 2


def test_overlapping_windows_are_not_clean():
    value = [100]
    meter = MemoryMeter(lambda: value[0])
    a = meter.begin()
    value[0] = 150
    assert meter.end(a) == (50, True)
    a, b = meter.begin(), meter.begin()
    value[0] = 170
    assert meter.end(a) == (20, False) and meter.end(b) == (20, False)


def test_a_clean_window_knows_its_peak_while_rss_came_back():
    import numpy as np

    from agent.memory import MemoryMeter, malloc_trim, tune_malloc

    tune_malloc()
    meter = MemoryMeter()
    window = meter.begin()
    scratch = np.ones(64 * MiB // 8)  # touched: resident
    del scratch
    malloc_trim()
    delta, clean = meter.end(window)
    if window.peak_tracked is False:
        pytest.skip("this kernel does not let a process reset its VmHWM (clear_refs)")
    assert clean and delta < 16 * MiB  # given back ...
    assert window.peak is not None and window.peak >= 48 * MiB  # ... but it was there
    other = meter.begin()
    overlapped = meter.begin()  # overlapping windows: no peak is claimed
    meter.end(overlapped)
    meter.end(other)
    assert other.peak is None and overlapped.peak is None


def test_load_peaks_are_learned_and_kept(tmp_path):
    from agent.memory import FootprintModel, Prior

    prior = Prior(1.0, 0, load_peak=2.0)
    model = FootprintModel(path=tmp_path / "footprints.json")
    assert model.load_peak("onnx", "cpu", prior) == 2.0  # the prior before any load
    for ratio in (1.3, 1.4, 1.5, 1.45, 1.35):
        model.observe_peak("onnx", 20 * MiB, int(ratio * 20 * MiB))
    model.observe_peak("onnx", MiB, 10 * MiB)  # a tiny load says nothing
    assert model.load_peak("onnx", "cpu", prior) == pytest.approx(1.5, rel=0.01)
    again = FootprintModel.load(tmp_path / "footprints.json")
    assert again.load_peak("onnx", "cpu", prior) == model.load_peak("onnx", "cpu", prior)
    assert again.load_peak("onnx", "cuda", prior) == 2.0  # per device class

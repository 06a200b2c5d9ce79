"""The DC-S3GD measurements of ``plan validate``: what each runs, and how they are kept and
judged (no job is started here)."""
import pytest

from kvstore_ext.plan.dcs3gd_jobs import Setting, load_measured, save_measured
from kvstore_ext.plan.validate import worst_ratio_error


def test_the_cpu_runs_at_batch_64_and_a_device_at_16():
    cpu, device = Setting.for_device(0.0, trials=3), Setting.for_device(0.1, trials=3)
    assert (cpu.batch_size, cpu.device_s) == (64, 0.0)
    assert (device.batch_size, device.device_s) == (16, 0.1)
    assert cpu.label == "LeNet on the CPU, batch 64"
    assert device.label == "LeNet on a simulated 100 ms device, batch 16"
    assert device.jobs() == 3 * 2 * 2            # trials x stores x regimes
    assert Setting() == Setting.for_device(0.0)  # bench_dcs3gd.py's defaults


def test_the_worst_ratio_error_ignores_the_step_times():
    rows = [{"store": "dist_ssgd", "error": 0.5}, {"store": "ratio", "error": -0.08},
            {"store": "dist_dcs3gd", "error": -0.4}, {"store": "ratio", "error": 0.03}]
    assert worst_ratio_error(rows) == pytest.approx(0.08)


def test_measurements_are_kept_beside_validate_json(tmp_path):
    assert load_measured(str(tmp_path / "validate.json")) == []
    kept = [("LeNet on the CPU, batch 64", {"injected_comm_s": 0.05, "args": {"batch_size": 64}}),
            ("LeNet on a simulated 100 ms device, batch 16", {"injected_comm_s": 0.11})]
    save_measured(str(tmp_path), kept)
    assert load_measured(str(tmp_path / "validate.json")) == kept

"""The benchmarks' quick mode runs end to end (worker process, JSON, CLI); speed is not checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from crl.bench import run_retrieval_benchmark
from crl.bench._measure import run_in_subprocess
from crl.bench.loss import plain_memory_estimate
from crl.bench.targets import bf16_targets, loss_targets
from crl.cli import app
from crl.errors import CrlValueError


def test_crl_bench_loss_quick_writes_consistent_results(tmp_path: Path) -> None:
    out = tmp_path / "results" / "loss.json"
    result = CliRunner().invoke(app, ["bench", "loss", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["benchmark"] == "loss" and data["quick"] is True and "targets" not in data
    assert data["matmul_gflops"] > 0
    assert len(data["machine_before"]["loadavg_1_5_15min"]) == 3
    (row,) = data["rows"]
    for impl in ("open_clip", "plain", "tiled"):
        assert row[impl]["seconds"] > 0
        assert row[impl]["peak_above_baseline_gib"] >= 0
    # The three implementations compute the same loss and gradients.
    assert row["loss_rel_diff_vs_open_clip"] < 1e-5 and row["loss_rel_diff_vs_plain"] < 1e-5
    for key in ("grad_norm", "scale_grad"):
        assert row["tiled"][key] == pytest.approx(row["plain"][key], rel=1e-4)
    assert "| 300 |" in result.output


def test_loss_targets_and_memory_estimate() -> None:
    rows = [
        {"batch": 8192, "time_ratio_tiled_vs_plain": 0.9, "tiled_fraction_of_matmul": 0.4,
         "tiled": {"peak_above_baseline_gib": 0.2, "seconds": 1.0}},
        {"batch": 32768, "time_ratio_tiled_vs_open_clip": 0.7, "tiled_fraction_of_matmul": 0.6,
         "tiled": {"peak_above_baseline_gib": 0.5, "seconds": 9.0}},
    ]
    targets = loss_targets(rows)
    assert targets["B=8192 tiled time <= 1.0 x plain"] == {"value": 0.9, "baseline": "plain",
                                                           "met": True}
    # crl's plain run did not fit: the open_clip one is the baseline.
    assert targets["B=32768 tiled time <= 0.6 x plain"] == {"value": 0.7,
                                                            "baseline": "open_clip", "met": False}
    assert targets["B=32768 tiled peak memory < 1 GiB above baseline"]["met"] is True
    assert targets["tiled >= 50% of matmul throughput at B >= 16384"] == {
        "value": {32768: 0.6}, "met": True}
    assert "B=16384 float32 effective throughput >= 85% of the float32 matmul" not in targets
    at_16k = {"batch": 16384, "tiled_fraction_of_matmul": 0.9,
              "tiled": {"seconds": 3.0, "fraction_of_matmul": 0.9,
                        "fraction_of_same_process_matmul": 0.84}}
    assert loss_targets([at_16k])["B=16384 float32 effective throughput >= 85% of the float32 "
                                  "matmul"] == {"value": 0.84, "against": "the same process",
                                                "separate_processes": 0.9, "met": False}
    assert plain_memory_estimate(32768) == 16 * 1024**3
    assert plain_memory_estimate(32768, "plain") == 24 * 1024**3


def test_bench_retrieval_quick_agrees_with_faiss() -> None:
    pytest.importorskip("faiss")
    data = run_retrieval_benchmark(quick=True)
    assert data["config"]["n"] == 2000 and "targets" not in data
    assert data["crl"]["seconds"] > 0 and data["faiss"]["seconds"] > 0
    assert data["time_ratio_crl_vs_faiss"] > 0
    for ours, theirs in data["x2y_recall_crl_vs_faiss"].values():
        assert ours == pytest.approx(theirs, abs=2 / 2000)  # float rounding may swap a near-tie
    assert 0.0 <= data["crl"]["metrics"]["retrieval/y2x_auc"] <= 1.0


def test_worker_process_reports_time_and_memory() -> None:
    (result,) = run_in_subprocess([{"kind": "loss", "impl": "tiled", "batch": 64, "dim": 8,
                                    "block_size": 16, "repeats": 2, "warmup": 1}])
    assert result["impl"] == "tiled" and len(result["times"]) == 2
    assert result["seconds"] == min(result["times"]) > 0
    assert result["peak_rss"] >= result["baseline_rss"] > 0
    assert result["loss"] > 0 and result["grad_norm"] > 0


def test_crl_bench_loss_bf16_quick_reports_ratios_and_accuracy(tmp_path: Path) -> None:
    out = tmp_path / "loss_bf16.json"
    result = CliRunner().invoke(app, ["bench", "loss", "--quick", "--dtype", "bf16",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["benchmark"] == "loss_bf16" and "targets" not in data
    assert set(data["matmul_gflops"]) == {"float32", "bfloat16"}
    (row,) = data["rows"]
    low, high = row["bfloat16"], row["float32"]
    assert low["grad_dtype"] == "bfloat16" and high["grad_dtype"] == "float32"
    # the bf16 backward's route is recorded (float32 has one route)
    assert low["backward_route"] in {"factored", "formed"} and "backward_route" not in high
    assert row["time_ratio_bf16_vs_float32"] == pytest.approx(low["seconds"] / high["seconds"],
                                                              rel=1e-3)
    # bf16 products on the same embeddings: close to float64, float32 closer still
    assert 0 < low["loss_rel_diff_vs_float64"] < 1e-2
    assert row["float32_loss_rel_diff_vs_float64"] < 1e-5 < low["loss_rel_diff_vs_float64"]
    assert low["grad_cosine_vs_float64"] >= 0.999
    assert low["loss"] == pytest.approx(low["float64_loss"], rel=1e-2)
    assert len(low["loadavg_1min_start_end"]) == 2 and low["cpu_seconds"] > 0
    assert "| 300 |" in result.output


def test_a_full_bf16_run_needs_bf16_matrix_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without bf16 matrix instructions a full ``--dtype bf16`` run is refused with the reason
    (through the CLI: one line, exit 2) before anything runs; ``--quick`` still runs."""
    import crl.bench.loss as loss_module

    monkeypatch.setattr(loss_module, "cpu_info", lambda: {
        "cpu_model": "Test CPU", "cpu_capability": "AVX2", "bf16_matrix_units": False})
    monkeypatch.setattr(loss_module, "run_tasks", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(CrlValueError, match=r"dtype='bf16'.*avx512_bf16.*Test CPU, AVX2"):
        loss_module.run_loss_benchmark(dtype="bf16")
    result = CliRunner().invoke(app, ["bench", "loss", "--dtype", "bf16"])
    assert result.exit_code == 2 and "bfloat16 matrix instructions" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_cpu_info_is_recorded_with_every_result() -> None:
    from crl.env import cpu_info, environment_info

    info = cpu_info()
    assert set(info) == {"cpu_model", "cpu_capability", "bf16_matrix_units"}
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert info["bf16_matrix_units"] in (True, False, None)
    assert {k: environment_info()[k] for k in info} == info


def test_bf16_targets() -> None:
    row = {"batch": 16384, "time_ratio_bf16_vs_float32": 0.55,
           "cpu_time_ratio_bf16_vs_float32": 0.5,
           "bfloat16": {"loss_rel_diff_vs_float64": 2e-2, "grad_cosine_vs_float64": 0.9995,
                        "fraction_of_matmul": 0.4},
           "float32": {"fraction_of_matmul": 0.86}}
    targets = bf16_targets([row])
    assert targets["B=16384 bf16 time <= 0.6 x float32 tiled (same run)"]["met"] is True
    assert targets["B=16384 bf16 loss within 1e-2 relative of float64"]["met"] is False
    assert targets["B=16384 bf16 gradient cosine >= 0.999 vs float64"]["met"] is True
    assert targets["B=16384 bf16 effective throughput >= 50% of the bf16 matmul"]["met"] is False
    assert targets["B=16384 float32 effective throughput >= 85% of the float32 matmul"] == {
        "value": 0.86, "against": "separate processes", "met": True}
    assert bf16_targets([{**row, "batch": 300}]) == {}
    # With the product measured in the loss's own process, that share decides (issue 26).
    own = {**row, "float32": {"fraction_of_matmul": 0.86, "fraction_of_same_process_matmul": 0.8}}
    assert bf16_targets([own])["B=16384 float32 effective throughput >= 85% of the float32 "
                               "matmul"] == {"value": 0.8, "against": "the same process",
                                             "separate_processes": 0.86, "met": False}


def test_a_loss_process_share_of_its_own_product() -> None:
    """``fraction_of_same_process_matmul``: the loss's ``8 B² D`` flops per second over the faster
    of the two products its own process measured around the timing."""
    from crl.bench.loss import SUITES, _row

    measured = {"times": [1.0], "cpu_seconds": 2.0, "loss": 9.5, "grad_norm": 0.1,
                "grad_dtype": "float32", "scale_grad": 0.01, "loadavg_1min_start_end": [1, 1],
                "baseline_rss": 0, "peak_rss": 2**30, "kind": "loss", "batch": 1000}
    results = [{**measured, "key": key, "dtype": dtype, "seconds": seconds,
                "matmul_gflops_same_process": own}
               for key, dtype, seconds, own in (("float32", "float32", 2.0, [4.0, 5.0]),
                                                ("bfloat16", "bfloat16", 1.0, None))]
    row = _row(SUITES["bf16"], 1000, 250, results, {}, {"float32": 2.5, "bfloat16": 10.0})
    flops = 8.0 * 1000 * 1000 * 250 / 1e9  # 2 GFLOP
    assert row["float32"]["fraction_of_matmul"] == round(flops / 2.0 / 2.5, 4)  # 0.4
    assert row["float32"]["fraction_of_same_process_matmul"] == round(flops / 2.0 / 5.0, 4)
    assert "fraction_of_same_process_matmul" not in row["bfloat16"]

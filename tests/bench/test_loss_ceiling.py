"""``benchmarks/loss_ceiling.py`` end to end at a small size: it writes every share it claims,
each consistent with the times it records."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "loss_ceiling.py"


def test_loss_ceiling_records_consistent_shares(tmp_path: Path) -> None:
    out = tmp_path / "ceiling.json"
    subprocess.run([sys.executable, str(SCRIPT), "--batch-size", "300", "--dim", "16",
                    "--block-size", "128", "--rounds", "2", "--product-side", "256",
                    "--out", str(out)], check=True, capture_output=True, text=True, timeout=300)
    result = json.loads(out.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["ceiling.json"]  # nothing half-written
    assert result["config"]["block_size"] == 128 and len(result["rounds"]) == 2
    flops = 8.0 * 300**2 * 16
    for row in result["rounds"]:
        reference = max(row["product_gflops"])
        assert reference > 0
        for key in ("loss_seconds", "products_seconds"):
            assert row[key] > 0
        # each share from the times recorded beside it, to the rounding the script records:
        # shares to 4 decimals, GFLOP/s to 0.1 (a few percent of the rate at this tiny size),
        # seconds to 6 decimals (a slack of 1e-3 relative)
        loss_rate = flops / row["loss_seconds"] / 1e9
        products_rate = flops / row["products_seconds"] / 1e9
        for rate, share in ((loss_rate, row["loss_share_of_product"]),
                            (products_rate, row["products_share_of_product"])):
            low = rate / (reference + 0.05) * (1 - 1e-3) - 5e-5
            high = rate / max(reference - 0.05, 1e-9) * (1 + 1e-3) + 5e-5
            assert 0 < share and low <= share <= high, (share, low, high)
        assert math.isclose(row["loss_share_of_products"],
                            row["products_seconds"] / row["loss_seconds"], rel_tol=1e-3,
                            abs_tol=1e-4)
    times = [r["loss_seconds"] for r in result["rounds"]]
    assert math.isclose(result["median"]["loss_seconds"], sum(times) / 2)  # median of two
    assert 0 < result["exp2_ns_per_element_one_thread"] < 1e3
    assert 0 < result["exp2_share_of_loss"]
    assert result["environment"]["torch"].startswith("2.")

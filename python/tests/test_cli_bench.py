"""`mlakit bench` (the C++ command) and `python -m mlakit.plot`: the files it writes, its work
model against FLOP and byte counts computed here from the preset's dimensions, and the chart.

The command is $MLAKIT_CLI (scripts/test_python.sh, and scripts/test.sh for the wheel test, point
it at the release build); the tests skip, saying so, when it is not set.
"""

import csv
import json
import os
import subprocess
import sys

import pytest

CLI = os.environ.get("MLAKIT_CLI")
pytestmark = pytest.mark.skipif(
    not CLI or not os.path.isfile(CLI), reason="MLAKIT_CLI does not name the mlakit command"
)

# deepseek-v2-lite (docs/cli.md): 16 heads, L 512, R 64, P 128, V 128, bf16 (2 bytes).
N, L, R, P, V, SIZE = 16, 512, 64, 128, 128, 2
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def bench_files(tmp_path_factory):
    """One quick CPU run (one timed repetition) writing JSON, CSV and the chart."""
    out = tmp_path_factory.mktemp("bench")
    files = {"json": out / "bench.json", "csv": out / "bench.csv", "png": out / "bench.png"}
    env = dict(os.environ, MLAKIT_PYTHON=sys.executable)
    proc = subprocess.run(
        [CLI, "bench", "--device", "cpu", "--quick", "--reps", "1", "--json", str(files["json"]),
         "--csv", str(files["csv"]), "--plot", str(files["png"])],
        capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    files["stdout"] = proc.stdout
    return files


def test_json_has_ceilings_and_every_kind(bench_files):
    results = json.loads(bench_files["json"].read_text())
    assert results["device"] == "cpu" and results["model"] == "deepseek-v2-lite"
    assert results["ceilings"]["memory_gbs"] > 0 and results["ceilings"]["gemm_gflops"] > 0
    kinds = {r["kind"] for r in results["results"]}
    assert kinds == {"decode", "prefill", "forward"}
    for r in results["results"]:
        assert r["time_s"] > 0
        roofline = max(r["bytes"] / (results["ceilings"]["memory_gbs"] * 1e9),
                       r["flops"] / (results["ceilings"]["gemm_gflops"] * 1e9))
        assert r["roofline_s"] == pytest.approx(roofline, rel=1e-9)
        assert r["roofline_fraction"] == pytest.approx(roofline / r["time_s"], rel=1e-9)


def test_work_model_matches_the_dimensions(bench_files):
    results = {r["case"]: r for r in json.loads(bench_files["json"].read_text())["results"]}
    decode = results["B=8 s_kv=1024"]
    keys = 8 * 1024
    assert decode["flops"] == pytest.approx(2 * N * keys * (L + R + L))
    kv_bytes = keys * (L + R) * SIZE
    assert decode["bytes"] == pytest.approx(kv_bytes + 8 * N * ((L + R) + L) * SIZE)
    prefill = results["S=256 causal"]
    assert prefill["flops"] == pytest.approx(2 * N * 256 * 257 / 2 * (P + R + V))


def test_csv_has_one_row_per_case(bench_files):
    results = json.loads(bench_files["json"].read_text())["results"]
    with open(bench_files["csv"], newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["case"] for r in rows] == [r["case"] for r in results]
    assert all(float(r["time_s"]) > 0 for r in rows)


def test_table_shows_roofline_percentages(bench_files):
    lines = bench_files["stdout"].splitlines()
    assert lines[0].startswith("mlakit bench: cpu")
    assert any("% roof" in line for line in lines)
    assert sum(line.endswith(("memory", "compute")) for line in lines) == len(
        json.loads(bench_files["json"].read_text())["results"])


def test_plot_writes_a_png(bench_files):
    data = bench_files["png"].read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_plot_module_alone(bench_files, tmp_path):
    png = tmp_path / "again.png"
    subprocess.run([sys.executable, "-m", "mlakit.plot", str(bench_files["json"]), str(png)],
                   check=True, timeout=120)
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_bad_device_is_a_flag_error(tmp_path):
    proc = subprocess.run([CLI, "bench", "--device", "tpu"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2
    assert "--device" in proc.stderr

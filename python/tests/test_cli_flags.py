"""`mlakit` (the C++ command): flags checked before anything runs, and output that cannot be
written failing the command (stress findings of 2026-12-07; docs/cli.md). Exit code 2 and one
error line naming the flag, without the run (each case takes well under a second).

The command is $MLAKIT_CLI, as for test_cli_bench.py; the tests skip when it is not set.
"""

import os
import subprocess

import pytest

CLI = os.environ.get("MLAKIT_CLI")
pytestmark = pytest.mark.skipif(
    not CLI or not os.path.isfile(CLI), reason="MLAKIT_CLI does not name the mlakit command"
)

# A run of a few milliseconds (2 requests, 2 layers, V2-Lite on the CPU).
SMALL = ["--no-progress", "--num-requests", "2", "--prompt-len", "16", "--output-len", "4"]


def mlakit(*args, env=None, stdout=subprocess.PIPE, timeout=60):
    return subprocess.run([CLI, *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          env=None if env is None else dict(os.environ, **env), timeout=timeout,
                          check=False)


def expect_flag_error(proc, *parts):
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, "no error message"
    assert "bad_alloc" not in proc.stderr and "host allocation" not in proc.stderr, proc.stderr
    for part in parts:
        assert part in lines[0], proc.stderr


@pytest.mark.parametrize("args, parts", [
    # Memory the machine does not have: refused before allocating, naming the flags.
    (["--num-layers", "100000000"], ["of host memory, more than the", "--num-layers 100000000"]),
    (["--num-blocks", "2147483647"], ["of host memory", "--num-blocks 2147483647"]),
    (["--num-requests", "2000000000"], ["of host memory", "--num-requests 2000000000"]),
    (["--kv-cache-gb", "100000"], ["of host memory", "blocks of --kv-cache-gb"]),
    (["--prompt-len", "2000000000"], ["of host memory", "automatic --num-blocks"]),
    # int32 bounds of the library (block ids, request ids, seq_lens).
    (["--num-blocks", "2147483648"],
     ["--num-blocks must be at most 2147483647 (block ids are int32), got 2147483648"]),
    (["--num-requests", "2147483648"], ["--num-requests must be at most 2147483647"]),
    (["--prompt-len", "2147483647"],
     ["--prompt-len max + --output-len max - 1 must be at most 2147483647"]),
    # --kv-cache-gb: non-finite and absurd values (they overflowed into "holds no block").
    (["--kv-cache-gb", "inf"], ["--kv-cache-gb: must be a finite number of GiB in (0, 1048576]"]),
    (["--kv-cache-gb", "nan"], ["--kv-cache-gb: must be a finite number of GiB"]),
    (["--kv-cache-gb", "1e19"], ["--kv-cache-gb: must be a finite number of GiB"]),
    (["--kv-cache-gb", "1e300"], ["--kv-cache-gb: must be a finite number of GiB"]),
    (["--kv-cache-gb", "1e9"], ["--kv-cache-gb: must be a finite number of GiB"]),
    # Seeds are uint64: no wrapping of -1, no saturation of 2^64.
    (["--seed", "-1"], ["--seed: must be an integer in [0, 18446744073709551615], got -1"]),
    (["--seed", "18446744073709551616"], ["--seed: must be an integer in [0, 18446744073709551615]"]),
    (["--json", ""], ["--json: must name a file, got an empty path"]),
])
def test_run_refuses_bad_sizes_up_front(args, parts):
    expect_flag_error(mlakit("run", "--no-progress", *args, timeout=20), *parts)


def test_largest_seed_runs():
    proc = mlakit("run", *SMALL, "--seed", "18446744073709551615")
    assert proc.returncode == 0, proc.stderr
    assert "seed 18446744073709551615" in proc.stdout


def test_unwritable_json_fails_before_the_run(tmp_path):
    proc = mlakit("run", *SMALL, "--json", str(tmp_path / "missing" / "summary.json"))
    expect_flag_error(proc, "--json", "cannot open for writing")
    assert proc.stdout == ""  # nothing ran


def test_full_disk_fails_the_run():
    with open("/dev/full", "w", encoding="utf-8") as full:
        proc = mlakit("run", *SMALL, stdout=full)
    expect_flag_error(proc, "cannot write to stdout")
    expect_flag_error(mlakit("run", *SMALL, "--json", "/dev/full"), "--json /dev/full: write failed")


def test_bench_csv_on_a_full_disk_fails(tmp_path):
    proc = mlakit("bench", "--quick", "--reps", "1", "--csv", "/dev/full", timeout=300)
    assert proc.returncode == 2
    assert "mlakit: error: --csv /dev/full: write failed" in proc.stderr
    for flag in ("--csv", "--json", "--plot"):
        expect_flag_error(mlakit("bench", flag, ""), f"{flag}: must name a file")
    expect_flag_error(mlakit("bench", "--json", str(tmp_path / "missing" / "b.json")),
                      "--json", "cannot open for writing")


def test_bench_refuses_csv_and_json_in_one_file(tmp_path):
    # The JSON, written last, silently replaced the CSV (the command then ran the whole grid).
    same = tmp_path / "results"
    for other in (str(same), str(tmp_path / "." / "results")):
        proc = mlakit("bench", "--quick", "--reps", "1", "--csv", str(same), "--json", other,
                      timeout=20)
        expect_flag_error(proc, "--csv", "--json", "name the same file")
    assert not same.exists()


def test_verify_heads_reports_the_heads_checked():
    proc = mlakit("run", *SMALL, "--verify", "--verify-heads", "1000")
    assert proc.returncode == 0, proc.stderr
    assert "fp64 oracle on 16 heads" in proc.stdout  # V2-Lite has 16 heads


def test_unknown_subcommand_is_named():
    expect_flag_error(mlakit("bogus"), 'unknown subcommand "bogus"')


@pytest.mark.parametrize("value", ["0", "-1", "abc", "99999999999"])
def test_bad_thread_count_is_reported(value):
    proc = mlakit("info", env={"MLAKIT_NUM_THREADS": value})
    assert proc.returncode == 0, proc.stderr
    assert f'mlakit: warning: MLAKIT_NUM_THREADS="{value}" is not a thread count' in proc.stderr
    assert "warning" not in mlakit("info", env={"MLAKIT_NUM_THREADS": "2"}).stderr

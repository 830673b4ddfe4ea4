"""benchmarks/disk_vs_fio.py with real fio and a real DiskTier, tiny sizes: both sides move the same bytes in every
step, and every row of the table comes out."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "disk_vs_fio.py"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_both_sides_move_the_same_bytes_and_every_row_is_reported(tmp_path):
    out = tmp_path / "out.json"
    # 10 objects asked for, 4 workers: fio's jobs take equal shares, so both sides write 8.
    cmd = [sys.executable, str(SCRIPT), "--dir", str(tmp_path / "d"), "--object-mib", "1", "--workers", "4"]
    cmd += ["--total-gib", str(10 / 1024), "--rounds", "2", "--job-files", "--io-mode", "buffered", "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    got = json.loads(out.read_text())
    rounds = got["rounds"]
    for kv, fio in (("kv_fill", "fio_fill"), ("kv_overwrite", "fio_overwrite"), ("kv_read", "fio_read")):
        assert [r["bytes"] for r in rounds[kv]] == [r["bytes"] for r in rounds[fio]] == [8 << 20] * 2
    assert [r["bytes"] for r in rounds["fio_fill_jobs"]] == [8 << 20] * 2
    assert set(got["figures"]) == {
        "fill vs fio fill",
        "overwrite vs fio overwrite",
        "fill vs fio overwrite",
        "read vs fio read",
        "fill vs fio fill, job files",
        "overwrite vs fio ow, job files",
        "fio fill / fio overwrite",
    }
    assert "fill vs fio fill" in run.stdout and list((tmp_path / "d").iterdir()) == []

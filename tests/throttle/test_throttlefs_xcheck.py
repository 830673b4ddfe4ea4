"""The kernel cross-check: the same fio workloads capped by the blkio cgroup throttle on a loop device and by throttlefs
order the same way over bandwidth, and both land near the cap (the JGU Mainz storage-tiering case study, 2026, did this
against dm-delay; this kernel has no device-mapper)."""

from __future__ import annotations

import pytest
from throttle_helpers import needs_fio, needs_fuse

from deploy.throttle import xcheck

pytestmark = [
    pytest.mark.slow,
    pytest.mark.serial,  # timed: both throttles measured against their caps
    pytest.mark.root,
    needs_fuse,
    needs_fio,
    pytest.mark.skipif(xcheck.missing() is not None, reason=f"cross-check: {xcheck.missing()}"),
]


def test_cgroup_and_throttlefs_orderings_agree(tmp_path):
    workloads = (("seq-read-1M-qd4", "read", "1M", 4), ("seq-write-1M-qd4", "write", "1M", 4))
    res = xcheck.cross_check(str(tmp_path), [60e6, 20e6], 1.5, workloads=workloads)
    assert res["orderings_agree"], res
    for p in res["points"]:
        # Both really throttle (so the agreement is not between two unthrottled runs) and both near the cap.
        for way in ("cgroup_mb_s", "throttlefs_mb_s"):
            assert p[way] == pytest.approx(p["cap_mb_s"], rel=0.15), p
    for c in res["over_bandwidth"].values():
        assert c == {"concordant": 1, "discordant": 0, "tied": 0}
    assert list(tmp_path.iterdir()) == []  # loop device, image, mounts and cgroup all gone


def test_pair_counts_treat_close_values_as_ties():
    c = xcheck.pair_counts([100, 50, 49], [90, 95, 60])
    assert c == {"concordant": 1, "discordant": 1, "tied": 1}
    assert xcheck.kendall_tau(c) == 0

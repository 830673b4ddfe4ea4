"""The tier contract (tier_contract.py) on the local tiers: the disk tier, the reference the others are held to, and
the shared directory tier on a local directory (on GlusterFS and CephFS: test_shared_glusterfs.py, test_s3_tier.py).
The Redis, Mooncake and S3 tiers run it in their own modules, beside their servers."""

from __future__ import annotations

import pytest
from tier_contract import contract_cases

from kvconnector.shared_tier import SharedDirTier
from kvconnector.tiers import DiskTier

MB = 1 << 20


@pytest.mark.parametrize("cls", [DiskTier, SharedDirTier], ids=["disk", "shared_dir"])
@pytest.mark.parametrize("check", contract_cases())
def test_the_tier_contract(tmp_path, cls, check):
    check(lambda prefix, cap=16 * MB: cls(str(tmp_path / prefix), cap))

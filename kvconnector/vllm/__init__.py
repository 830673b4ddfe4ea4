"""kvtier as a secondary tier of vLLM's own tiered KV offloading (`OffloadingConnector` + `TieringOffloadingSpec`).

- `kvconnector.vllm.tier.KvtierTier`: the `SecondaryTierManager` vLLM loads from
  `"secondary_tiers": [{"type": "KvtierTier", "module_path": "kvconnector.vllm.tier", ...}]`.
- `kvconnector.vllm.driver.ManagerDriver`: vLLM's real tiering manager driven through its scheduler calls, no GPU.
Importing this package imports nothing from vLLM; each module does (the rest of kvconnector never does).
"""

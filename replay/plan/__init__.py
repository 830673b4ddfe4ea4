"""`kvtier plan`: predict per-round prefix hit rates of multi-round sessions over a tiered KV cache (no server).

The model is in `model` (importable: `simulate(workload, tiers)`), the command line in `cli`, the table and the
figure in `report`."""

from .model import COLLAPSE_FRACTION, ChainLRU, MPParams, PlanResult, RoundResult, TierSpec, Workload, simulate

__all__ = ["COLLAPSE_FRACTION", "ChainLRU", "MPParams", "PlanResult", "RoundResult", "TierSpec", "Workload", "simulate"]

"""Autoscaling decisions: how many users to run next, from what the last interval showed.

qos mode holds the storage saturation (busy share of the I/O workers) within `band` of the target and backs off,
with a cooldown, when a QoS class missed its SLA; capacity mode ramps users up while throughput grows and stops at the
step where throughput fell, going back to the peak. The driver really starts and stops user workers on each decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import AutoscalerConfig


@dataclass(frozen=True, slots=True)
class Decision:
    users: int
    action: str  # scale_up | scale_down | hold | peak_found
    reason: str


class Autoscaler:
    def __init__(self, cfg: AutoscalerConfig, mode: str, target_saturation: float) -> None:
        self.cfg = cfg
        self.mode = mode
        self.target = target_saturation
        self._cooldown_until = -math.inf
        self._prev_tput: float | None = None
        self._peak: tuple[int, float] | None = None
        self.done = False

    def _clamp(self, users: int) -> int:
        return max(self.cfg.min_users, min(self.cfg.max_users, users))

    def decide(self, t_s: float, users: int, throughput: float, saturation: float, sla_missed: list[str]) -> Decision:
        return (
            self._qos(t_s, users, saturation, sla_missed) if self.mode == "qos" else self._capacity(users, throughput)
        )

    def _qos(self, t_s: float, users: int, saturation: float, sla_missed: list[str]) -> Decision:
        c = self.cfg
        if t_s < self._cooldown_until:
            return Decision(users, "hold", "cooldown")
        if sla_missed or saturation > self.target + c.band:
            new = self._clamp(min(users - 1, math.floor(users * c.scale_down_factor)))
            self._cooldown_until = t_s + c.cooldown_s
            why = f"SLA missed by {', '.join(sla_missed)}" if sla_missed else f"saturation {saturation:.2f} above band"
            return Decision(new, "scale_down" if new < users else "hold", why)
        if saturation < self.target - c.band:
            new = self._clamp(max(users + 1, math.ceil(users * c.scale_up_factor)))
            return Decision(new, "scale_up" if new > users else "hold", f"saturation {saturation:.2f} below band")
        return Decision(users, "hold", f"saturation {saturation:.2f} within band")

    def _capacity(self, users: int, throughput: float) -> Decision:
        c = self.cfg
        if self.done:
            return Decision(users, "hold", "peak capacity found")
        prev = self._prev_tput
        self._prev_tput = throughput
        if self._peak is None or throughput > self._peak[1]:
            self._peak = (users, throughput)
        if prev is not None and throughput < prev:
            self.done = True
            peak_users, peak_tput = self._peak
            return Decision(
                peak_users,
                "peak_found",
                f"Peak capacity found: throughput fell from {prev:,.0f} to {throughput:,.0f} tok/s; "
                f"peak {peak_tput:,.0f} tok/s at {peak_users} users",
            )
        growth = (throughput - prev) / prev if prev else math.inf
        factor = c.ramp_factor if growth > c.fast_growth else c.fine_factor
        new = self._clamp(max(users + 1, math.ceil(users * factor)))
        if new == users:
            self.done = True
            return Decision(users, "peak_found", "Peak capacity found: reached autoscaler.max_users")
        return Decision(new, "scale_up", f"throughput growth {growth:.0%}" if prev else "first step")

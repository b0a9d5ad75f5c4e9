"""What a warm run proved: per target, how many instances answered (distinct ids), how many were cold, what failed.

`distinct` counts instance ids seen in replies, nothing else: a reply without an id (a function that does not
speak the warmstart ping) is counted as `unverified`, never as a warmed instance.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

DUPLICATE = "DuplicateInstance"


@dataclass(slots=True)
class PingResult:
    """One ping's outcome after its retries."""

    index: int
    attempts: int = 0
    throttled: int = 0  # attempts answered with a throttle
    instance_id: str | None = None
    cold: bool | None = None
    executed_version: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    elapsed_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error_type is None


@dataclass(slots=True)
class TargetReport:
    target: str
    asked: int
    reason: str  # why `asked` is what it is (fixed, prewarm, or the adaptive policy's account)
    pings: list[PingResult] = field(default_factory=list)
    duration_ms: float = 0.0
    payload_style: str = "warmstart"

    @property
    def instance_ids(self) -> list[str]:
        return sorted({p.instance_id for p in self.pings if p.instance_id})

    @property
    def distinct(self) -> int:
        return len(self.instance_ids)

    @property
    def cold(self) -> int:
        # Per instance, not per reply: an instance is cold at most once.
        return len({p.instance_id for p in self.pings if p.instance_id and p.cold})

    @property
    def answered(self) -> int:
        return sum(1 for p in self.pings if p.ok)

    @property
    def unverified(self) -> int:
        return sum(1 for p in self.pings if p.ok and not p.instance_id)

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Failed pings grouped by (type, message), with how many, so 50 throttles are one line, not 50."""
        groups = Counter((p.error_type, p.error_message) for p in self.pings if not p.ok)
        errors = [{"type": t, "message": m, "count": n} for (t, m), n in sorted(groups.items(), key=str)]
        duplicates = self.answered - self.unverified - self.distinct
        if duplicates > 0:
            # A ping that succeeded on an instance another ping already reached warmed nothing new: the usual
            # cause is a throttled ping retried after the holds ended. Said here so a shortfall always has a line.
            retried = sum(1 for p in self.pings if p.ok and p.instance_id and p.throttled)
            message = (
                f"{duplicates} ping(s) answered by an instance that had already answered "
                f"({retried} of the successful pings were throttled first); hold_ms may be too short"
            )
            errors.append({"type": DUPLICATE, "message": message, "count": duplicates})
        return errors

    @property
    def ok(self) -> bool:
        return self.distinct >= self.asked and not self.errors

    def to_dict(self) -> dict[str, Any]:
        versions = sorted({p.executed_version for p in self.pings if p.executed_version})
        return {
            "target": self.target,
            "asked": self.asked,
            "distinct": self.distinct,
            "cold": self.cold,
            "warm": self.distinct - self.cold,
            "answered": self.answered,
            "duplicates": self.answered - self.unverified - self.distinct,
            "unverified": self.unverified,
            "shortfall": max(0, self.asked - self.distinct),
            "throttled": sum(p.throttled for p in self.pings),
            "retries": sum(max(0, p.attempts - 1) for p in self.pings),
            "errors": self.errors,
            "duration_ms": round(self.duration_ms, 1),
            "executed_versions": versions,
            "instance_ids": self.instance_ids,
            "payload_style": self.payload_style,
            "reason": self.reason,
            "ok": self.ok,
        }


@dataclass(slots=True)
class RunReport:
    correlation_id: str
    hold_ms: int
    prewarm: bool = False
    targets: list[TargetReport] = field(default_factory=list)
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.targets)

    def to_dict(self) -> dict[str, Any]:
        return {
            "correlation_id": self.correlation_id,
            "hold_ms": self.hold_ms,
            "prewarm": self.prewarm,
            "ok": self.ok,
            "duration_ms": round(self.duration_ms, 1),
            "targets": [t.to_dict() for t in self.targets],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)

    def format_table(self) -> str:
        head = f"{'target':<40} {'asked':>5} {'distinct':>8} {'cold':>4} {'errors':>6} {'ms':>8}  reason"
        lines = [head]
        for t in self.targets:
            n_errors = sum(e["count"] for e in t.errors)
            lines.append(
                f"{t.target[-40:]:<40} {t.asked:>5} {t.distinct:>8} {t.cold:>4} {n_errors:>6} {t.duration_ms:>8.0f}  "
                f"{t.reason}"
            )
            lines.extend(f"    {e['count']} x {e['type']}: {e['message']}" for e in t.errors)
            if t.unverified:
                lines.append(f"    {t.unverified} replies carried no instance id (not a warmstart ping reply)")
        verdict = "ok" if self.ok else "SHORTFALL"
        lines.append(f"{verdict}: {len(self.targets)} target(s) in {self.duration_ms:.0f} ms, hold {self.hold_ms} ms")
        return "\n".join(lines)

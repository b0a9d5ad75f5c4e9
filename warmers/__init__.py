"""Keep-warm scheduler: N overlapping pings per target, proof of the distinct instances that answered."""

from __future__ import annotations

from warmers.adaptive import CloudWatchHistory, FileHistory, Policy
from warmers.config import PAYLOAD_STYLES, ConfigError, Target, WarmerConfig, parse_targets
from warmers.fanout import Warmer
from warmers.report import RunReport, TargetReport

__all__ = [
    "PAYLOAD_STYLES",
    "CloudWatchHistory",
    "ConfigError",
    "FileHistory",
    "Policy",
    "RunReport",
    "Target",
    "TargetReport",
    "Warmer",
    "WarmerConfig",
    "parse_targets",
]

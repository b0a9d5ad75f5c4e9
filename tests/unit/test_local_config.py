"""LocalLambdaConfig: the default memory size is the deployed one; Lambda's ranges are enforced."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infra.local.config import DEFAULT_MEMORY_MB, LocalLambdaConfig

ROOT = Path(__file__).resolve().parents[2]


def test_default_memory_is_template_yaml_memory_size() -> None:
    text = (ROOT / "template.yaml").read_text()
    match = re.search(r"^  MemorySize:\n(?:    .*\n)*?    Default: (\d+)", text, re.M)
    assert match is not None and int(match.group(1)) == DEFAULT_MEMORY_MB == LocalLambdaConfig().memory_mb


@pytest.mark.parametrize(
    "settings",
    [{"memory_mb": 64}, {"memory_mb": 20_000}, {"cgroups": "v3"}, {"jitter": "pareto"}, {"max_retry_attempts": 3}],
)
def test_out_of_range_settings_are_refused(settings: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LocalLambdaConfig(**settings)  # type: ignore[arg-type]

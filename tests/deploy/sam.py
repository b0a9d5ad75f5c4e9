"""Helpers shared by the deploy tests: load template.yaml, stand in for `sam package`, run the SAM transform."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from cfnlint.decode import decode_str
from samtranslator.translator.transform import transform

ROOT = Path(__file__).resolve().parent.parent.parent
TEMPLATE = ROOT / "template.yaml"
REGION = "us-east-1"
IMAGE_URI = "123456789012.dkr.ecr.us-east-1.amazonaws.com/warmstart:cpu"


def load_template() -> dict[str, Any]:
    """template.yaml as plain JSON data (SAM's short-form tags such as !Ref expanded)."""
    data, errors = decode_str(TEMPLATE.read_text())
    assert not errors, errors
    assert data is not None
    result: dict[str, Any] = json.loads(json.dumps(data))
    return result


def package(template: dict[str, Any], bucket: str) -> dict[str, Any]:
    """What `sam build && sam package` do to it: local code paths become S3 objects, images get an ImageUri."""
    out = copy.deepcopy(template)
    for logical_id, resource in out["Resources"].items():
        props = resource.get("Properties", {})
        for key in ("CodeUri", "ContentUri"):
            if isinstance(props.get(key), str) and not props[key].startswith("s3://"):
                props[key] = f"s3://{bucket}/{logical_id}.zip"
        if props.get("PackageType") == "Image":
            props["ImageUri"] = IMAGE_URI
    return out


class NoManagedPolicies:
    """The template names no managed policy by name, so the translator never needs IAM to look one up."""

    def load(self) -> dict[str, str]:
        return {}


def sam_transform(template: dict[str, Any], parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)  # the translator builds ARNs for the session's region
    return transform(copy.deepcopy(template), parameters or {}, NoManagedPolicies())  # type: ignore[arg-type]

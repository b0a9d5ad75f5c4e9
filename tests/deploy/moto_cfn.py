"""CloudFormation support moto 5.2 lacks for the transformed template: Lambda versions (`GetAtt .Version`),
aliases and function URLs. Each creates the real object in moto's Lambda backend where moto models it, so
the test then checks the Lambda API, not these classes.

moto builds its resource-type map from `CloudFormationModel.__subclasses__()` (cached): defining these and
clearing the cache registers them, later definitions winning over moto's own `AWS::Lambda::Version`.
"""

from __future__ import annotations

from typing import Any

from moto.awslambda.models import lambda_backends
from moto.cloudformation import parsing
from moto.core.common_models import CloudFormationModel


class Version(CloudFormationModel):
    def __init__(self, arn: str, version: str) -> None:
        self.arn, self.version = arn, version

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::Lambda::Version"

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr == "Version"

    def get_cfn_attribute(self, attribute_name: str) -> str:
        return self.version

    @property
    def physical_resource_id(self) -> str:
        return self.arn

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kw: Any
    ) -> Version:
        fn = lambda_backends[account_id][region_name].publish_version(cloudformation_json["Properties"]["FunctionName"])
        assert fn is not None
        return cls(fn.function_arn, str(fn.version))


class Alias(CloudFormationModel):
    def __init__(self, arn: str) -> None:
        self.arn = arn

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::Lambda::Alias"

    @property
    def physical_resource_id(self) -> str:
        return self.arn

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kw: Any
    ) -> Alias:
        props = cloudformation_json["Properties"]
        alias = lambda_backends[account_id][region_name].create_alias(
            props["Name"], props["FunctionName"], str(props["FunctionVersion"]), props.get("Description", ""), ""
        )
        return cls(alias.arn)


class Url(CloudFormationModel):
    """moto's create_function_url_config refuses qualified ARNs, so an alias URL is recorded here only."""

    def __init__(self, target: str, auth_type: str) -> None:
        self.target, self.auth_type = target, auth_type
        self.url = f"https://{abs(hash(target)):x}.lambda-url.us-east-1.on.aws/"

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::Lambda::Url"

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr in ("FunctionUrl", "FunctionArn")

    def get_cfn_attribute(self, attribute_name: str) -> str:
        return self.url if attribute_name == "FunctionUrl" else self.target

    @property
    def physical_resource_id(self) -> str:
        return self.target

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kw: Any
    ) -> Url:
        props = cloudformation_json["Properties"]
        return cls(props["TargetFunctionArn"], props["AuthType"])


def register() -> None:
    for cached in (parsing.get_model_list, parsing.get_model_map, parsing.get_name_type_map):
        cached.cache_clear()

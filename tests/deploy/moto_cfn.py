"""CloudFormation support moto 5.2 lacks for the transformed template: Lambda versions (`GetAtt .Version`),
aliases and function URLs; CloudWatch alarms, the CodeDeploy application and deployment groups (issue 18). Each
creates the real object in moto's backend where moto models it, so the test then checks the API, not these
classes.

moto builds its resource-type map from `CloudFormationModel.__subclasses__()` (cached): defining these and
clearing the cache registers them, later definitions winning over moto's own `AWS::Lambda::Version`.
"""

from __future__ import annotations

from typing import Any

from moto.awslambda.models import lambda_backends
from moto.cloudformation import parsing
from moto.cloudwatch.models import Dimension, Metric, MetricDataQuery, MetricStat, cloudwatch_backends
from moto.codedeploy.models import codedeploy_backends
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


class CloudWatchAlarm(CloudFormationModel):
    def __init__(self, name: str) -> None:
        self.name = name

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::CloudWatch::Alarm"

    @property
    def physical_resource_id(self) -> str:
        return self.name

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kw: Any
    ) -> CloudWatchAlarm:
        p = cloudformation_json["Properties"]
        name = p.get("AlarmName") or resource_name
        queries = None
        if p.get("Metrics"):
            queries = []
            for q in p["Metrics"]:
                stat = None
                if "MetricStat" in q:
                    m = q["MetricStat"]["Metric"]
                    dims = [Dimension(d["Name"], d["Value"]) for d in m.get("Dimensions", [])]
                    stat = MetricStat(
                        Metric(m["MetricName"], m["Namespace"], dims),
                        q["MetricStat"]["Period"],
                        q["MetricStat"]["Stat"],
                        q["MetricStat"].get("Unit"),
                    )
                queries.append(
                    MetricDataQuery(
                        q["Id"], q.get("Label"), q.get("Period"), q.get("ReturnData"), q.get("Expression"), stat
                    )
                )
        cloudwatch_backends[account_id][region_name].put_metric_alarm(
            name=name,
            namespace=p.get("Namespace"),
            metric_name=p.get("MetricName"),
            metric_data_queries=queries,
            comparison_operator=p["ComparisonOperator"],
            evaluation_periods=int(p["EvaluationPeriods"]),
            period=p.get("Period"),
            threshold=float(p["Threshold"]),
            statistic=p.get("Statistic"),
            extended_statistic=p.get("ExtendedStatistic"),
            description=p.get("AlarmDescription", ""),
            dimensions=list(p.get("Dimensions", [])),
            alarm_actions=[],
            treat_missing_data=p.get("TreatMissingData"),
        )
        return cls(name)


class CodeDeployApplication(CloudFormationModel):
    def __init__(self, name: str) -> None:
        self.name = name

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::CodeDeploy::Application"

    @property
    def physical_resource_id(self) -> str:
        return self.name

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kw: Any
    ) -> CodeDeployApplication:
        p = cloudformation_json["Properties"]
        name = p.get("ApplicationName") or f"{resource_name}-app"
        codedeploy_backends[account_id][region_name].create_application(name, p["ComputePlatform"], [])
        return cls(name)


class CodeDeployDeploymentGroup(CloudFormationModel):
    def __init__(self, name: str) -> None:
        self.name = name

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::CodeDeploy::DeploymentGroup"

    @property
    def physical_resource_id(self) -> str:
        return self.name

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kw: Any
    ) -> CodeDeployDeploymentGroup:
        p = cloudformation_json["Properties"]
        alarms = p.get("AlarmConfiguration", {})
        rollback = p.get("AutoRollbackConfiguration", {})
        style = p.get("DeploymentStyle", {})
        codedeploy_backends[account_id][region_name].create_deployment_group(
            application_name=p["ApplicationName"],
            deployment_group_name=resource_name,
            deployment_config_name=p.get("DeploymentConfigName"),
            ec2_tag_filters=None,
            on_premises_instance_tag_filters=None,
            auto_scaling_groups=None,
            service_role_arn=p["ServiceRoleArn"],
            alarm_configuration={  # type: ignore[arg-type]  # the API's shape, as moto's own responses pass it
                "enabled": alarms.get("Enabled", False),
                "alarms": [{"name": a["Name"]} for a in alarms.get("Alarms", [])],
            },
            auto_rollback_configuration={"enabled": rollback.get("Enabled"), "events": rollback.get("Events", [])},
            deployment_style={
                "deploymentType": style.get("DeploymentType"),
                "deploymentOption": style.get("DeploymentOption"),
            },
        )
        return cls(resource_name)


def register() -> None:
    for cached in (parsing.get_model_list, parsing.get_model_map, parsing.get_name_type_map):
        cached.cache_clear()

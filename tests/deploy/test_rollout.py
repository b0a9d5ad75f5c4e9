"""template.yaml's safe rollout: CodeDeploy application and deployment groups (type a parameter), PreTraffic hooks
with least-privilege permissions, rollback alarms on the new version's metrics, the dashboard."""

from __future__ import annotations

import json
import re
from typing import Any

import boto3
import pytest
from moto.codedeploy.models import codedeploy_backends
from moto.core import DEFAULT_ACCOUNT_ID

from handler.observability import metrics
from tests.deploy.sam import REGION, load_template, package, sam_transform

BUCKET = "warmstart-deploy-test"
MODELS = {"ImageFunction": "ImagePreTrafficHook", "ZipFunction": "ZipPreTrafficHook"}
WARMER_METRICS = {"Asked", "Distinct", "Cold", "Shortfall"}


@pytest.fixture(scope="module")
def transformed() -> dict[str, Any]:
    return sam_transform(package(load_template(), BUCKET))


def resources(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == kind}


def version_of(template: dict[str, Any], function: str) -> str:
    (version,) = (k for k in resources(template, "AWS::Lambda::Version") if k.startswith(f"{function}Version"))
    return version


@pytest.mark.parametrize("kind", ["Canary10Percent5Minutes", "Linear10PercentEvery1Minute", "AllAtOnce"])
def test_deployment_type_is_a_parameter(kind: str) -> None:
    out = sam_transform(package(load_template(), BUCKET), {"DeploymentType": kind})
    groups = resources(out, "AWS::CodeDeploy::DeploymentGroup")
    assert set(groups) == {f"{f}DeploymentGroup" for f in MODELS}
    for group in groups.values():
        assert group["Properties"]["DeploymentConfigName"]["Fn::Sub"][1] == {"ConfigName": kind}


def test_codedeploy_wiring(transformed: dict[str, Any]) -> None:
    (app,) = resources(transformed, "AWS::CodeDeploy::Application").values()
    assert app["Properties"]["ComputePlatform"] == "Lambda"
    role = transformed["Resources"]["CodeDeployServiceRole"]["Properties"]
    assert role["ManagedPolicyArns"] == ["arn:aws:iam::aws:policy/service-role/AWSCodeDeployRoleForLambda"]
    for function, hook in MODELS.items():
        group = transformed["Resources"][f"{function}DeploymentGroup"]["Properties"]
        prefix = function.removesuffix("Function")
        assert group["AlarmConfiguration"] == {
            "Enabled": True,
            "Alarms": [{"Name": {"Ref": f"{prefix}FaultRateAlarm"}}, {"Name": {"Ref": f"{prefix}InitDurationAlarm"}}],
        }
        assert "DEPLOYMENT_STOP_ON_ALARM" in group["AutoRollbackConfiguration"]["Events"]
        update = transformed["Resources"][f"{function}Aliaslive"]["UpdatePolicy"]["CodeDeployLambdaAliasUpdate"]
        assert update["BeforeAllowTrafficHook"] == {"Ref": hook}
        assert update["DeploymentGroupName"] == {"Ref": f"{function}DeploymentGroup"}


def test_hooks_target_the_new_version_with_least_privilege(transformed: dict[str, Any]) -> None:
    for function, hook in MODELS.items():
        props = transformed["Resources"][hook]["Properties"]
        assert props["Handler"] == "warmers.pretraffic.lambda_handler"
        # SAM's CodeDeploy role may invoke only functions named CodeDeployHook_*.
        assert props["FunctionName"]["Fn::Sub"].startswith("CodeDeployHook_")
        version = {"Ref": version_of(transformed, function)}
        env = props["Environment"]["Variables"]
        assert env["WARMSTART_ROLLOUT_TARGET"] == version and env["WARMSTART_ROLLOUT_WARM"] == {"Ref": "RolloutWarm"}
        assert "DeploymentPreference" not in load_template()["Resources"][hook]["Properties"]  # a hook is not rolled
        role = transformed["Resources"][f"{hook}Role"]["Properties"]
        statements = [s for p in role["Policies"] for s in p["PolicyDocument"]["Statement"]]
        assert statements == [
            {
                "Effect": "Allow",
                "Action": "codedeploy:PutLifecycleEventHookExecutionStatus",
                "Resource": {
                    "Fn::Sub": "arn:${AWS::Partition}:codedeploy:${AWS::Region}:${AWS::AccountId}:"
                    "deploymentgroup:${ServerlessDeploymentApplication}/*"
                },
            },
            {"Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": version},
        ]


def test_alarms_watch_the_new_version_with_our_metric_names(transformed: dict[str, Any]) -> None:
    alarms = resources(transformed, "AWS::CloudWatch::Alarm")
    assert set(alarms) == {"ImageFaultRateAlarm", "ImageInitDurationAlarm", "ZipFaultRateAlarm", "ZipInitDurationAlarm"}
    for name, alarm in alarms.items():
        function = "ImageFunction" if name.startswith("Image") else "ZipFunction"
        new_version = {"Fn::GetAtt": [version_of(transformed, function), "Version"]}
        p = alarm["Properties"]
        stats = [m["MetricStat"]["Metric"] for m in p.get("Metrics", []) if "MetricStat" in m] or [p]
        ours = [m for m in stats if m["Namespace"] == {"Ref": "MetricsNamespace"}]
        assert ours, name
        for metric in ours:
            assert metric["MetricName"] in metrics.BY_VERSION  # emitted with the function_version dimension
            assert {"Name": "function_version", "Value": new_version} in metric["Dimensions"]
            assert {"Name": "function_name", "Value": {"Ref": function}} in metric["Dimensions"]
        lambda_side = [m for m in stats if m["Namespace"] == "AWS/Lambda"]
        for metric in lambda_side:
            assert {"Name": "ExecutedVersion", "Value": new_version} in metric["Dimensions"]
        assert p["TreatMissingData"] == "notBreaching"  # no traffic yet is not a reason to roll back
    assert alarms["ZipInitDurationAlarm"]["Properties"]["MetricName"] == "RestoreDuration"  # SnapStart's cold start


def dashboard_body(template: dict[str, Any]) -> dict[str, Any]:
    raw = template["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    assert set(re.findall(r"\$\{([^}]+)\}", raw)) <= {"MetricsNamespace", "AWS::Region"}
    body: dict[str, Any] = json.loads(raw.replace("${MetricsNamespace}", "warmstart").replace("${AWS::Region}", REGION))
    return body


def test_dashboard_charts_metrics_that_exist(transformed: dict[str, Any]) -> None:
    body = dashboard_body(transformed)
    names = {
        m
        for w in body["widgets"]
        for row in w["properties"]["metrics"]
        for m in re.findall(r'MetricName="(\w+)"', row[0]["expression"])
    }
    assert names <= set(metrics.UNITS) | WARMER_METRICS
    assert {"ColdStart", "RestoreStart", "InitDuration", "RestoreDuration", "Errors", "Distinct", "Asked"} <= names


def check_rollout_deployed(physical: dict[str, str], outputs: dict[str, str]) -> None:
    """Called from test_template's moto deployment (inside its mock): what CloudFormation really created."""
    codedeploy = boto3.client("codedeploy", region_name=REGION)
    (app,) = codedeploy.list_applications()["applications"]
    assert app == physical["ServerlessDeploymentApplication"]
    cw = boto3.client("cloudwatch", region_name=REGION)
    alarm_names = {a["AlarmName"] for a in cw.describe_alarms()["MetricAlarms"]}
    assert len(alarm_names) == 4
    for function in MODELS:
        group = codedeploy.get_deployment_group(
            applicationName=app, deploymentGroupName=physical[f"{function}DeploymentGroup"]
        )
        info = group["deploymentGroupInfo"]
        assert info["deploymentConfigName"] == "CodeDeployDefault.LambdaCanary10Percent5Minutes"
        # moto's API leaves alarmConfiguration out of its answer: read what CloudFormation stored.
        stored = codedeploy_backends[DEFAULT_ACCOUNT_ID][REGION].deployment_groups[app][info["deploymentGroupName"]]
        alarms = stored.alarm_configuration
        assert alarms["enabled"] is True and {a["name"] for a in alarms["alarms"]} <= alarm_names
        assert len(alarms["alarms"]) == 2
    lam = boto3.client("lambda", region_name=REGION)
    for function, hook in MODELS.items():
        config = lam.get_function(FunctionName=physical[hook])["Configuration"]
        assert config["FunctionName"].startswith("CodeDeployHook_")
        target = config["Environment"]["Variables"]["WARMSTART_ROLLOUT_TARGET"]
        assert target.startswith(lam.get_function(FunctionName=physical[function])["Configuration"]["FunctionArn"])
    assert outputs["DashboardName"] in {d["DashboardName"] for d in cw.list_dashboards()["DashboardEntries"]}

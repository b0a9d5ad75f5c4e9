"""template.yaml: cfn-lint clean, the SAM transform succeeds, and the result deploys into moto's CloudFormation."""

from __future__ import annotations

import ast
import io
import json
import zipfile
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from cfnlint.api import lint_file
from moto import mock_aws

from tests.deploy import moto_cfn
from tests.deploy.sam import IMAGE_URI, REGION, TEMPLATE, load_template, package, sam_transform
from tests.deploy.test_rollout import check_rollout_deployed

BUCKET = "warmstart-deploy-test"
MODEL_HANDLER = "handler.app.lambda_handler"
WARMER_HANDLER = "warmers.app.lambda_handler"
HOOKS = ("ImagePreTrafficHook", "ZipPreTrafficHook")  # issue 18: tests/deploy/test_rollout.py


def resources_of(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == kind}


@pytest.fixture(scope="module")
def transformed() -> dict[str, Any]:
    return sam_transform(package(load_template(), BUCKET))


def test_cfn_lint_clean() -> None:
    matches = lint_file(TEMPLATE)
    assert [str(m) for m in matches] == []


def test_sam_template_shape() -> None:
    functions = resources_of(load_template(), "AWS::Serverless::Function")
    assert set(functions) == {"ImageFunction", "ZipFunction", "WarmerFunction", "GenerateFunction", *HOOKS}
    image, zipped, warmer = (functions[k]["Properties"] for k in ("ImageFunction", "ZipFunction", "WarmerFunction"))
    assert image["PackageType"] == "Image" and image["AutoPublishAlias"] == "live"
    assert functions["ImageFunction"]["Metadata"]["Dockerfile"] == "infra/deploy/Dockerfile"
    assert zipped["Runtime"] == "python3.12" and zipped["Handler"] == MODEL_HANDLER
    assert zipped["SnapStart"] == {"ApplyOn": "PublishedVersions"} and zipped["AutoPublishAlias"] == "live"
    assert zipped["Layers"] == [{"Ref": "DependencyLayer"}, {"Ref": "ModelLayer"}]
    # The warmer's code is issue 6's; here only its wiring: a module path under warmers/, a `module.function`.
    assert warmer["Handler"] == WARMER_HANDLER
    package_name, module, function = warmer["Handler"].split(".")
    assert (package_name, module, function) == ("warmers", "app", "lambda_handler") and function.isidentifier()
    assert warmer["CodeUri"] == "build/layers/warmer.zip"
    params = load_template()["Parameters"]
    assert {"MemorySize", "ModelPath", "WarmConcurrency", "WarmSchedule"} <= set(params)


def test_sam_transform(transformed: dict[str, Any]) -> None:
    kinds = [r["Type"] for r in transformed["Resources"].values()]
    assert kinds.count("AWS::Lambda::Function") == 4 + len(HOOKS)  # GenerateFunction's only with a model
    assert kinds.count("AWS::Lambda::Alias") == 4
    assert kinds.count("AWS::Lambda::Url") == 3
    assert kinds.count("AWS::Lambda::LayerVersion") == 2
    zipped = transformed["Resources"]["ZipFunction"]["Properties"]
    assert zipped["SnapStart"] == {"ApplyOn": "PublishedVersions"}
    # Function URLs serve the alias (the published, SnapStart-able version), never $LATEST.
    for url in resources_of(transformed, "AWS::Lambda::Url").values():
        assert url["Properties"]["TargetFunctionArn"]["Ref"].endswith("Aliaslive")


def test_schedule_targets_the_warmer_alias(transformed: dict[str, Any]) -> None:
    (rule,) = resources_of(transformed, "AWS::Events::Rule").values()
    assert rule["Properties"]["ScheduleExpression"] == {"Ref": "WarmSchedule"}
    assert [t["Arn"] for t in rule["Properties"]["Targets"]] == [{"Ref": "WarmerFunctionAliaslive"}]


def test_warmer_may_invoke_only_the_aliases(transformed: dict[str, Any]) -> None:
    role = transformed["Resources"]["WarmerFunctionRole"]["Properties"]
    statements = [s for p in role["Policies"] for s in p["PolicyDocument"]["Statement"]]
    assert statements == [
        {
            "Effect": "Allow",
            "Action": "lambda:InvokeFunction",
            "Resource": [{"Ref": "ImageFunctionAliaslive"}, {"Ref": "ZipFunctionAliaslive"}],
        },
        {"Effect": "Allow", "Action": "cloudwatch:GetMetricStatistics", "Resource": "*"},
    ]


def test_adaptive_warming_is_a_switch(transformed: dict[str, Any]) -> None:
    env = transformed["Resources"]["WarmerFunction"]["Properties"]["Environment"]["Variables"]
    assert env["WARMSTART_WARM_HISTORY"] == {"Fn::If": ["WarmAdaptiveOn", "cloudwatch", {"Ref": "AWS::NoValue"}]}


GENERATE = {"GenerateModel": "s3://models/qwen3/0.1.0/", "GenerateModelBucket": "models"}


def test_the_generation_function_streams_through_its_url_and_the_rest_api() -> None:
    generate = resources_of(load_template(), "AWS::Serverless::Function")["GenerateFunction"]
    assert generate["Metadata"]["Dockerfile"] == "infra/deploy/Dockerfile.generate"
    out = sam_transform(package(load_template(), BUCKET), GENERATE)
    resources = out["Resources"]
    function = resources["GenerateFunction"]["Properties"]
    assert function["PackageType"] == "Image" and (function["MemorySize"], function["Timeout"]) == (3008, 120)
    assert function["Environment"]["Variables"]["WARMSTART_MODEL"] == {"Ref": "GenerateModel"}
    url = resources["GenerateFunctionUrl"]["Properties"]
    assert url["InvokeMode"] == "RESPONSE_STREAM" and url["TargetFunctionArn"] == {"Ref": "GenerateFunctionAliaslive"}
    # The REST API's Lambda proxy integration in response-streaming mode (InvokeWithResponseStream).
    post = resources["ServerlessRestApi"]["Properties"]["Body"]["paths"]["/invocations"]["Fn::If"][1]["post"]
    integration = post["Fn::If"][1]["x-amazon-apigateway-integration"]
    assert integration["responseTransferMode"] == "STREAM" and integration["type"] == "aws_proxy"
    assert "/2021-11-15/functions/${GenerateFunctionAliaslive}/response-streaming-invocations" in json.dumps(
        integration["uri"]
    )
    # Without a model there is no generation function: every part of it is conditional.
    conditions = {
        k: resources[k].get("Condition") for k in resources if k.startswith(("Generate", "ServerlessRestApi"))
    }
    assert conditions.pop("GenerateFunctionUrlPublic") == "PublicGenerateUrl"
    assert len(conditions) > 5 and set(conditions.values()) == {"HasGenerateModel"}


def test_public_urls_only_when_asked() -> None:
    template = package(load_template(), BUCKET)
    for auth, public in (("AWS_IAM", False), ("NONE", True)):
        out = sam_transform(template, {"FunctionUrlAuthType": auth})
        perms = {k for k, r in out["Resources"].items() if r.get("Condition") == "PublicUrls"}
        assert perms == {"ImageFunctionUrlPublic", "ZipFunctionUrlPublic"}
        assert out["Conditions"]["PublicUrls"] == {"Fn::Equals": [{"Ref": "FunctionUrlAuthType"}, "NONE"]}
        assert public == (auth == "NONE")


def dummy_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("placeholder.txt", "deploy test")
    return buf.getvalue()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)
    moto_cfn.register()
    with mock_aws():
        yield


@pytest.mark.usefixtures("aws")
def test_deploys_into_moto(transformed: dict[str, Any]) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    for logical_id in ("ZipFunction", "WarmerFunction", "DependencyLayer", "ModelLayer", *HOOKS):
        s3.put_object(Bucket=BUCKET, Key=f"{logical_id}.zip", Body=dummy_zip())
    cfn = boto3.client("cloudformation", region_name=REGION)
    cfn.create_stack(
        StackName="warmstart",
        TemplateBody=json.dumps(transformed),
        Parameters=[{"ParameterKey": "WarmConcurrency", "ParameterValue": "3"}],
        Capabilities=["CAPABILITY_IAM"],
    )
    (stack,) = cfn.describe_stacks(StackName="warmstart")["Stacks"]
    assert stack["StackStatus"] == "CREATE_COMPLETE"
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}
    physical = {
        r["LogicalResourceId"]: r["PhysicalResourceId"]
        for r in cfn.list_stack_resources(StackName="warmstart")["StackResourceSummaries"]
    }

    lam = boto3.client("lambda", region_name=REGION)
    aliases = {}
    for logical_id in ("ImageFunction", "ZipFunction", "WarmerFunction"):
        name = physical[logical_id]
        alias = lam.get_alias(FunctionName=name, Name="live")
        assert alias["FunctionVersion"] != "$LATEST"
        aliases[logical_id] = alias["AliasArn"]
    # moto's CloudFormation drops PackageType, Layers and SnapStart: test_sam_transform checks those.
    assert lam.get_function(FunctionName=physical["ImageFunction"])["Code"]["ImageUri"] == IMAGE_URI
    zipped = lam.get_function(FunctionName=physical["ZipFunction"])["Configuration"]
    assert zipped["Handler"] == MODEL_HANDLER and zipped["Runtime"] == "python3.12"
    layer_ids = [k for k in physical if k.startswith(("DependencyLayer", "ModelLayer"))]
    assert len(layer_ids) == 2 and len(lam.list_layers()["Layers"]) == 2
    warmer = lam.get_function(FunctionName=physical["WarmerFunction"])["Configuration"]
    assert warmer["Handler"] == WARMER_HANDLER
    env = warmer["Environment"]["Variables"]
    assert env["WARMSTART_WARM_TARGETS"].split(",") == [aliases["ImageFunction"], aliases["ZipFunction"]]
    assert str(env["WARMSTART_WARM_CONCURRENCY"]) == "3"  # moto keeps the Number parameter an int
    assert outputs["ImageFunctionAliasArn"] == aliases["ImageFunction"]
    assert outputs["ZipFunctionAliasArn"] == aliases["ZipFunction"]
    assert outputs["ImageFunctionUrl"].startswith("https://") and outputs["ZipFunctionUrl"].startswith("https://")
    check_rollout_deployed(physical, outputs)

    events = boto3.client("events", region_name=REGION)
    (rule,) = events.list_rules()["Rules"]
    assert rule["ScheduleExpression"] == "rate(5 minutes)"
    targets = events.list_targets_by_rule(Rule=rule["Name"])["Targets"]
    assert [t["Arn"] for t in targets] == [aliases["WarmerFunction"]]

    # EventBridge may invoke the warmer's alias; the warmer's role may invoke the two model aliases and read
    # CloudWatch statistics (adaptive N), nothing else.
    policy = json.loads(lam.get_policy(FunctionName=physical["WarmerFunction"], Qualifier="live")["Policy"])
    assert [s["Principal"] for s in policy["Statement"]] == [{"Service": "events.amazonaws.com"}]
    iam = boto3.client("iam", region_name=REGION)
    role_name = warmer["Role"].rsplit("/", 1)[-1]
    (policy_name,) = iam.list_role_policies(RoleName=role_name)["PolicyNames"]
    doc = iam.get_role_policy(RoleName=role_name, PolicyName=policy_name)["PolicyDocument"]
    # moto's CloudFormation stores an inline policy as the Python repr of the dict.
    doc = ast.literal_eval(doc) if isinstance(doc, str) else doc
    assert doc["Statement"] == [
        {
            "Effect": "Allow",
            "Action": "lambda:InvokeFunction",
            "Resource": [aliases["ImageFunction"], aliases["ZipFunction"]],
        },
        {"Effect": "Allow", "Action": "cloudwatch:GetMetricStatistics", "Resource": "*"},
    ]

"""The TaskSystem construct in an app of your own, and your handlers package in the worker's code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Template
from coworker.errors import ConfigurationError
from coworker_cdk import constants as c
from coworker_cdk.bundling import function_bundling
from coworker_cdk.config import StackConfig
from coworker_cdk.task_system import TaskSystem

from tests.infra.test_stack import fake_pip, functions_by_role
from tests.support.handler_packages import write_handler_package


def function_asset(assembly_dir: str | Path, template: dict, role: str = "worker") -> Path:
    """The bundled code folder of a function ("worker", "api"...) in a synthesized assembly."""
    for resource in template["Resources"].values():
        properties = resource["Properties"]
        if resource["Type"] == "AWS::Lambda::Function" and properties["Description"].lower().startswith(
                f"coworker {role}"):
            asset_hash = properties["Code"]["S3Key"].removesuffix(".zip")
            return Path(assembly_dir) / f"asset.{asset_hash}"
    raise AssertionError(f"no {role} function in the template")


def worker_asset(assembly_dir: str, template: dict) -> Path:
    return function_asset(assembly_dir, template, "worker")


def synth_system(tmp_path: Path, **options) -> tuple[Template, dict, Path]:
    app = App(outdir=str(tmp_path / "cdk.out"))
    stack = Stack(app, "TeamStack")
    TaskSystem(stack, "Tasks", layer_dependencies="skip", **{"handlers": "examples", **options})
    assembly = app.synth()
    template = assembly.get_stack_by_name("TeamStack").template
    return Template.from_json(template), template, worker_asset(assembly.directory, template)


def test_your_handlers_package_is_in_the_function_code_and_imported_by_it(tmp_path) -> None:
    package, name, _ = write_handler_package(tmp_path / "src")
    template, raw, asset = synth_system(tmp_path, handlers=str(package), max_concurrency=40, batch_size=10)
    assert (asset / "handler.py").is_file()  # the worker's own Lambda handler
    for relative in ("__init__.py", "math_tasks.py", "reports/summary.py", "requirements.txt"):
        assert (asset / name / relative).read_text() == (package / relative).read_text(), relative
    functions = functions_by_role(template)
    worker_env = functions["worker"]["Environment"]["Variables"]
    assert worker_env["COWORKER_HANDLER_MODULES"] == name
    assert worker_env["COWORKER_EXAMPLE_HANDLERS"] == "False"  # the examples only when asked for
    examples = synth_system(tmp_path / "with-examples", handlers=str(package), example_handlers=True)[0]
    assert functions_by_role(examples)["worker"]["Environment"]["Variables"]["COWORKER_EXAMPLE_HANDLERS"] == "True"
    assert functions["api"]["Environment"]["Variables"]["COWORKER_HANDLER_MODULES"] == name  # checks types
    # The coordinator's code has no handlers package: it must not import it.
    assert name not in functions["coordinator"]["Environment"]["Variables"]["COWORKER_HANDLER_MODULES"]
    api_asset = function_asset(tmp_path / "cdk.out", raw, "api")
    assert (api_asset / name / "math_tasks.py").is_file() and (api_asset / "handler.py").is_file()
    assert functions["worker"]["ReservedConcurrentExecutions"] == 4  # options reach the settings


def test_the_examples_alone_are_deployed_only_when_asked_for_by_name(tmp_path) -> None:
    template, _, asset = synth_system(tmp_path, handlers="examples")
    assert sorted(p.name for p in asset.iterdir()) == ["handler.py"]
    env = functions_by_role(template)["worker"]["Environment"]["Variables"]
    assert env["COWORKER_EXAMPLE_HANDLERS"] == "True" and env["COWORKER_HANDLER_MODULES"] == ""


@pytest.mark.parametrize(("options", "message"), [
    ({}, "option handlers is required: the folder of your handlers package"),
    ({"handlers": None}, "option handlers is required"),
    ({"handlers": "none"}, "would deploy nothing to run"),
    ({"handlers": "examples", "example_handlers": False}, "there would be nothing to run"),
])
def test_a_system_without_handlers_is_refused_rather_than_deploying_someone_elses(options, message) -> None:
    # (an installed construct has no handlers of this repository to fall back on)
    with pytest.raises(ConfigurationError, match=_literal(message)):
        TaskSystem(Stack(App(), "NoHandlers"), "Tasks", **options)


def test_the_stack_without_a_handlers_folder_says_how_to_name_one(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # an app folder with no handlers/
    with pytest.raises(ConfigurationError, match="-c handlersDir=path/to/your_package, or -c handlersDir=examples"):
        StackConfig.from_context(App().node)


def test_the_stack_bundles_the_handlers_dir_from_context(synthesize, tmp_path) -> None:
    package, name, _ = write_handler_package(tmp_path)
    stack, assembly = synthesize({"handlersDir": str(package), "exampleHandlers": "false"})
    template = assembly.get_stack_by_name(stack.stack_name).template
    asset = worker_asset(assembly.directory, template)
    assert (asset / name / "math_tasks.py").is_file()
    env = functions_by_role(Template.from_json(template))["worker"]["Environment"]["Variables"]
    assert (env["COWORKER_HANDLER_MODULES"], env["COWORKER_EXAMPLE_HANDLERS"]) == (name, "False")


def test_the_stack_keeps_the_logical_ids_it_had_before_the_construct(synthesize) -> None:
    """A stack deployed before TaskSystem existed must update in place, not replace its table."""
    stack, assembly = synthesize({})
    resources = assembly.get_stack_by_name(stack.stack_name).template["Resources"]
    assert resources["TasksTable45D1B62D"]["Type"] == "AWS::DynamoDB::GlobalTable"
    assert resources["ProcessingWorkerFunction0FCA871E"]["Type"] == "AWS::Lambda::Function"
    assert resources["ApiHandlerFunction426EBE6D"]["Type"] == "AWS::Lambda::Function"


def test_in_your_own_app_the_function_roles_keep_the_logical_ids_of_the_previous_release(tmp_path) -> None:
    """An upgrade updates each function's role in place in any app, not only in this repository's
    stack (tests/infra/test_upgrade.py): the ids the release e5c3fc027a89 gave ``TaskSystem(stack,
    "Tasks")``'s roles, read from its synth."""
    _, raw, _ = synth_system(tmp_path, handlers="examples")
    roles = {raw["Resources"][body["Properties"]["Role"]["Fn::GetAtt"][0]]["Properties"]["Description"].split()[1]:
             body["Properties"]["Role"]["Fn::GetAtt"][0]
             for body in raw["Resources"].values() if body["Type"] == "AWS::Lambda::Function"}
    assert roles == {"API:": "TasksApiHandlerFunctionServiceRole58AD014F",
                     "coordinator:": "TasksProcessingCoordinatorFunctionServiceRole2787DFE6",
                     "worker:": "TasksProcessingWorkerFunctionServiceRoleFDF9302B"}


def test_handler_requirements_are_installed_as_lambda_wheels_next_to_the_package(tmp_path, monkeypatch) -> None:
    calls: list = []
    locks: list = []

    def pip(command, **kwargs):
        locks.append(Path(command[command.index("--requirement") + 1]).read_text())
        fake_pip(calls)(command, **kwargs)

    monkeypatch.setattr("coworker_cdk.bundling.subprocess.run", pip)
    resolved = "lxml==5.3.0 --hash=sha256:" + "c" * 64 + "\n"
    monkeypatch.setattr("coworker_cdk.bundling.resolve", lambda text: resolved if "lxml==5.3.0" in text else "")
    package, name, _ = write_handler_package(tmp_path, requirements="# parsing\nlxml==5.3.0\n")
    bundler = function_bundling(c.FUNCTIONS_DIR / c.WORKER_DIR_NAME, package, install_dependencies=True,
                              dependency_cache=tmp_path / "cache")
    out = tmp_path / "out"
    assert bundler.try_bundle(str(out), image=None) is True
    (command,) = calls
    assert locks == [resolved]  # the requirements as resolved at synth, installed exactly
    assert [command[i + 1] for i, word in enumerate(command) if word == "--platform"] == list(c.PIP_PLATFORMS)
    assert "--only-binary=:all:" in command
    assert (out / "pynamodb").is_dir()  # what pip installed sits at the root of the function's code
    assert (out / name / "math_tasks.py").is_file() and (out / "handler.py").is_file()


def test_requirements_with_only_comments_run_no_pip(tmp_path, monkeypatch) -> None:
    calls: list = []
    monkeypatch.setattr("coworker_cdk.bundling.subprocess.run", fake_pip(calls))
    package, _, _ = write_handler_package(tmp_path, requirements="# nothing yet\n\n")
    bundler = function_bundling(c.FUNCTIONS_DIR / c.WORKER_DIR_NAME, package, install_dependencies=True,
                              dependency_cache=tmp_path / "cache")
    bundler.try_bundle(str(tmp_path / "out"), image=None)
    assert calls == []


def test_the_asset_hash_follows_the_handlers_code(tmp_path) -> None:
    package, _, _ = write_handler_package(tmp_path)
    worker_dir = c.FUNCTIONS_DIR / c.WORKER_DIR_NAME
    before = function_bundling(worker_dir, package, install_dependencies=False).asset_hash()
    (package / "math_tasks.py").write_text((package / "math_tasks.py").read_text() + "\n# changed\n")
    assert function_bundling(worker_dir, package, install_dependencies=False).asset_hash() != before


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_concurency": 10}, "unknown Coworker option 'max_concurency' (did you mean 'max_concurrency'?)"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"batch_size": "ten"}, "batch_size"),
        ({"worker_memory_mb": 64}, "worker_memory_mb must be a whole number of at least 128"),
        ({"schedule_minutes": 1.5}, "schedule_minutes must be a whole number"),
        ({"removal_policy": "keep"}, "removal_policy must be retain or destroy"),
        ({"handlers": "/no/such/folder"}, "is not a folder"),
        ({"status_shards": 0}, "option status_shards (context statusShards)"),
        ({"warm_write_units": 100}, "warm_write_units must be a whole number of at least 4000"),
        ({"warm_read_units": 100}, "warm_read_units must be a whole number of at least 12000"),
    ],
)
def test_bad_options_fail_at_synth_with_a_clear_error(options: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=_literal(message)):
        TaskSystem(Stack(App(), "Bad"), "Tasks", **{"handlers": "examples", **options})


def test_a_folder_without_init_is_refused_with_the_fix(tmp_path) -> None:
    (tmp_path / "my_tasks").mkdir()
    with pytest.raises(ConfigurationError, match="has no __init__.py; add an empty one"):
        StackConfig.from_options(handlers=str(tmp_path / "my_tasks"))


def test_config_and_options_are_not_mixed() -> None:
    with pytest.raises(TypeError):
        TaskSystem(Stack(App(), "Both"), "Tasks", config=StackConfig.from_options(handlers="examples"),
                   max_concurrency=5)


def test_every_option_is_documented_in_deploy_md() -> None:
    from coworker_cdk.config import CONTEXT_OPTIONS

    documented = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    missing = [f"{key}/{name}" for key, name in CONTEXT_OPTIONS.items()
               if f"`{key}`" not in documented or f"`{name}`" not in documented]
    assert missing == []


def _literal(text: str) -> str:
    import re

    return re.escape(text)


def test_large_results_go_to_a_private_bucket_the_worker_writes_and_the_api_reads(tmp_path) -> None:
    template, raw, _ = synth_system(tmp_path, inline_result_bytes=1024, inline_payload_bytes=2048)
    (bucket_id,) = template.find_resources("AWS::S3::Bucket")
    template.has_resource_properties("AWS::S3::Bucket", {
        "BucketEncryption": {"ServerSideEncryptionConfiguration": [
            {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]},
        "PublicAccessBlockConfiguration": {"BlockPublicAcls": True, "BlockPublicPolicy": True,
                                           "IgnorePublicAcls": True, "RestrictPublicBuckets": True},
    })
    policy = json.dumps(template.find_resources("AWS::S3::BucketPolicy"))
    assert "aws:SecureTransport" in policy  # TLS only
    functions = functions_by_role(template)
    for role in ("worker", "api"):
        env = functions[role]["Environment"]["Variables"]
        assert env["COWORKER_RESULT_BUCKET"] == {"Ref": bucket_id}, role
        assert env["COWORKER_INLINE_RESULT_BYTES"] == "1024", role
        assert env["COWORKER_INLINE_PAYLOAD_BYTES"] == "2048", role
    assert "COWORKER_RESULT_BUCKET" not in functions["coordinator"]["Environment"]["Variables"]
    by_role: dict[str, set] = {}
    for resource in raw["Resources"].values():
        if resource["Type"] != "AWS::IAM::Policy":
            continue
        name = resource["Properties"]["PolicyName"]
        role = "worker" if "Worker" in name else "api" if "Api" in name else name
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if any(a.startswith("s3:") for a in actions):
                where = json.dumps(statement["Resource"])
                assert bucket_id in where
                by_role.setdefault(role, set()).update((action, where.split("/")[-2]) for action in actions)
    assert by_role == {"worker": {("s3:PutObject", "results"), ("s3:PutObject", "payloads"),
                                  ("s3:GetObject", "payloads"),
                                  ("s3:GetObject", "results")},  # a callback reads its batch's results
                       "api": {("s3:GetObject", "results"), ("s3:PutObject", "payloads")}}


def test_without_the_bucket_no_bucket_and_no_setting(tmp_path) -> None:
    template, _, _ = synth_system(tmp_path, results_bucket=False)
    assert template.find_resources("AWS::S3::Bucket") == {}
    for fn in functions_by_role(template).values():
        assert "COWORKER_RESULT_BUCKET" not in fn["Environment"]["Variables"]


def test_iam_authorization_replaces_api_keys(synthesize) -> None:
    stack, assembly = synthesize({"apiAuth": "iam"})
    artifact = assembly.get_stack_by_name(stack.stack_name)
    template = Template.from_json(artifact.template)
    methods = template.find_resources("AWS::ApiGateway::Method")
    assert methods and {m["Properties"]["AuthorizationType"] for m in methods.values()} == {"AWS_IAM"}
    assert not any(m["Properties"].get("ApiKeyRequired") for m in methods.values())
    assert template.find_resources("AWS::ApiGateway::ApiKey") == {}
    (policy,) = template.find_resources("AWS::IAM::ManagedPolicy").values()
    statement = policy["Properties"]["PolicyDocument"]["Statement"][0]
    assert statement["Action"] == "execute-api:Invoke"
    assert "ApiInvokePolicyArn" in artifact.template["Outputs"] and "ApiKeyId" not in artifact.template["Outputs"]
    assert _api_environment(template)["COWORKER_API_AUTH"] == "iam"  # what its OpenAPI document declares


def _api_environment(template: Template) -> dict:
    (api,) = [fn for fn in template.find_resources("AWS::Lambda::Function").values()
              if fn["Properties"]["Description"].startswith("Coworker API")]
    return api["Properties"]["Environment"]["Variables"]


def test_api_keys_are_the_default(synthesize) -> None:
    stack, assembly = synthesize({})
    artifact = assembly.get_stack_by_name(stack.stack_name)
    template = Template.from_json(artifact.template)
    methods = template.find_resources("AWS::ApiGateway::Method")
    assert {m["Properties"]["AuthorizationType"] for m in methods.values()} == {"NONE"}
    assert all(m["Properties"]["ApiKeyRequired"] for m in methods.values())
    assert len(template.find_resources("AWS::ApiGateway::ApiKey")) == 1
    assert "ApiKeyId" in artifact.template["Outputs"]
    assert _api_environment(template)["COWORKER_API_AUTH"] == "api-key"


def test_an_unknown_auth_mode_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="api_auth must be api-key or iam"):
        StackConfig.from_options(handlers="examples", api_auth="cognito")


def _table(template: dict) -> dict:
    (table,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::DynamoDB::GlobalTable"]
    return table


def test_the_status_index_is_sharded_and_every_function_knows_the_shard_count(synthesize) -> None:
    stack, assembly = synthesize({"statusShards": "16"})
    template = assembly.get_stack_by_name(stack.stack_name).template
    (index,) = _table(template)["GlobalSecondaryIndexes"]
    assert index["IndexName"] == "status-shard-due"
    assert index["KeySchema"][0] == {"AttributeName": "status_shard", "KeyType": "HASH"}
    assert "status" in index["Projection"]["NonKeyAttributes"]  # listings show the plain status
    for role, function in functions_by_role(Template.from_json(template)).items():
        assert function["Environment"]["Variables"]["COWORKER_STATUS_SHARDS"] == "16", role


def test_the_legacy_index_is_kept_only_while_migrating(synthesize) -> None:
    stack, assembly = synthesize({"legacyStatusIndex": "true"})
    table = _table(assembly.get_stack_by_name(stack.stack_name).template)
    names = {ix["IndexName"]: ix["KeySchema"][0]["AttributeName"] for ix in table["GlobalSecondaryIndexes"]}
    assert names == {"status-shard-due": "status_shard", "status-due": "status"}
    assert {"AttributeName": "status", "AttributeType": "S"} in table["AttributeDefinitions"]


def test_warm_throughput_is_a_deploy_option_for_the_table_and_its_index(synthesize) -> None:
    stack, assembly = synthesize({"warmWriteUnits": "20000", "warmReadUnits": "40000"})
    table = _table(assembly.get_stack_by_name(stack.stack_name).template)
    warm = {"WriteUnitsPerSecond": 20000, "ReadUnitsPerSecond": 40000}
    assert table["WarmThroughput"] == warm
    assert table["GlobalSecondaryIndexes"][0]["WarmThroughput"] == warm
    stack, assembly = synthesize({})
    table = _table(assembly.get_stack_by_name(stack.stack_name).template)
    assert "WarmThroughput" not in table and "WarmThroughput" not in table["GlobalSecondaryIndexes"][0]

"""The container runner (ECS Fargate) in the template: built when a deployed task type runs on it
(runner="container", or a time limit longer than a Lambda worker gives), absent otherwise; its
task role is the worker's grants, and the coordinator may start exactly its task definition."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Template
from coworker.config import Settings
from coworker.errors import ConfigurationError
from coworker.observability import MetricName
from coworker_cdk import constants as c
from coworker_cdk.config import StackConfig
from coworker_cdk.declared import runners_of
from coworker_cdk.runner_image import RunnerImageContext
from coworker_cdk.task_system import TaskSystem

from tests.infra.support import runner_environment, runner_image_context
from tests.infra.test_stack import actions_of, alarm_metric, alarms_by_id, functions_by_role, policy_statements, role_of
from tests.support.handler_packages import write_handler_package

LONG_TASKS = '''
    from coworker import task_handler

    HOUR = 3600

    @task_handler("export", timeout_seconds=2 * HOUR)  # longer than Lambda allows: the container runner
    def export(payload, context):
        return None

    @task_handler("reindex", runner="container")  # asks for it, with no limit
    def reindex(payload, context):
        return None

    @task_handler("resize", timeout_seconds=600, runner="lambda")
    def resize(payload, context):
        return None
'''
SUBNETS = ("subnet-0123456789abcdef0", "subnet-0fedcba9876543210")
SECURITY_GROUP = "sg-0123456789abcdef0"


def long_tasks_package(root: Path) -> tuple[Path, str]:
    """A team's handlers package (tests/support) with a module of container types added."""
    package, name, _ = write_handler_package(root)
    (package / "long_tasks.py").write_text(textwrap.dedent(LONG_TASKS))
    return package, name


def synth(tmp_path: Path, **options) -> tuple[TaskSystem, dict, Path]:
    """A TaskSystem in a stack of its own: (the construct, its template, the assembly folder)."""
    app = App(outdir=str(tmp_path / "cdk.out"))
    stack = Stack(app, "TeamStack")
    system = TaskSystem(stack, "Tasks", layer_dependencies="skip", alarm_email="ops@example.com",
                        **{"handlers": "examples", **options})
    assembly = app.synth()
    return system, assembly.get_stack_by_name("TeamStack").template, Path(assembly.directory)


@pytest.fixture(scope="module")
def with_runner(tmp_path_factory) -> tuple[TaskSystem, dict, Path, str]:
    root = tmp_path_factory.mktemp("runner")
    package, name = long_tasks_package(root / "src")
    system, template, assembly = synth(root, handlers=str(package))
    return system, template, assembly, name


@pytest.fixture(scope="module")
def template(with_runner) -> dict:
    return with_runner[1]


def of_type(template: dict, kind: str) -> dict[str, dict]:
    return {logical_id: resource for logical_id, resource in template["Resources"].items()
            if resource["Type"] == kind}


def the_one(template: dict, kind: str) -> tuple[str, dict]:
    (found,) = of_type(template, kind).items()
    return found[0], found[1].get("Properties", {})


def statements_with(template: dict, action: str) -> dict[str, list[dict]]:
    """Statements that allow ``action``, by the logical id of the role holding them."""
    return {role: [st for st in sts if action in actions_of(st)]
            for role, sts in policy_statements(Template.from_json(template)).items()
            if any(action in actions_of(st) for st in sts)}


# --- which types run on the container runner -----------------------------------------------------


def _package(root: Path, body: str) -> Path:
    package = root / "jobs"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "files.py").write_text(textwrap.dedent(body))
    return package


def test_the_container_types_are_those_that_ask_for_it_or_need_longer_than_lambda_gives(tmp_path) -> None:
    package = _package(tmp_path, '''
        from coworker import task_handler

        @task_handler("at-the-limit", timeout_seconds=885)
        def a(payload, context): ...

        @task_handler("just-beyond", timeout_seconds=885.5)
        def b(payload, context): ...

        @task_handler("asks", runner="container")
        def c(payload, context): ...

        @task_handler("short-but-asks", timeout_seconds=30, runner="container")
        def d(payload, context): ...

        @task_handler("lambda-by-name", timeout_seconds=60, runner="lambda")
        def e(payload, context): ...

        @task_handler("no-runner-said", timeout_seconds=10, runner=None)
        def f(payload, context): ...
    ''')
    split = runners_of(package, False, Settings())
    assert split.container_types == ("asks", "just-beyond", "short-but-asks")
    # Only the Lambda types' limits size the worker.
    assert split.lambda_limits == {"at-the-limit": 885.0, "lambda-by-name": 60.0, "no-runner-said": 10.0}
    config = StackConfig.from_options(handlers=str(package))
    assert config.settings.worker_timeout_seconds == 900  # 885 s on Lambda: the longest it gives


@pytest.mark.parametrize(("declaration", "problem"), [
    ('runner="gpu"', "runner of task type 'odd' must be 'lambda' or 'container', not 'gpu'"),
    ("runner=RUNNER", "runner of task type 'odd' must be the string 'lambda' or 'container'"),
    ('runner="container".lower()', "must be the string"),
])
def test_a_runner_the_stack_cannot_read_or_accept_is_refused_with_its_line(tmp_path, declaration, problem) -> None:
    package = _package(tmp_path, f'''
        from coworker import task_handler

        RUNNER = "container"

        @task_handler("odd", {declaration})
        def odd(payload, context):
            return None
    ''')
    with pytest.raises(ConfigurationError, match=problem.replace("(", r"\(")) as refused:
        StackConfig.from_options(handlers=str(package))
    assert "files.py:6" in str(refused.value)


def test_a_runner_on_a_type_not_named_by_a_literal_is_refused(tmp_path) -> None:
    package = _package(tmp_path, '''
        from coworker import task_handler

        NAME = "export"

        @task_handler(NAME, runner="container")
        def export(payload, context):
            return None
    ''')
    with pytest.raises(ConfigurationError, match="files.py:6: a task type that declares timeout_seconds or runner"):
        StackConfig.from_options(handlers=str(package))


# --- the runner's resources ----------------------------------------------------------------------


def test_a_cluster_and_an_arm64_fargate_task_definition_running_the_image(with_runner, template) -> None:
    system, _, _, _ = with_runner
    assert the_one(template, "AWS::ECS::Cluster")[0].startswith("TasksRunners")
    _, definition = the_one(template, "AWS::ECS::TaskDefinition")
    assert definition["RuntimePlatform"] == {"CpuArchitecture": "ARM64", "OperatingSystemFamily": "LINUX"}
    assert (definition["Cpu"], definition["Memory"]) == ("1024", "2048")  # the defaults
    assert definition["RequiresCompatibilities"] == ["FARGATE"] and definition["NetworkMode"] == "awsvpc"
    (container,) = definition["ContainerDefinitions"]
    assert container["Name"] == Settings().runner_container == "runner"  # what RunTask's overrides name
    assert container["StopTimeout"] == 120 and container["Essential"] is True
    assert container["Image"]["Fn::Sub"].endswith(f":{system.runner.image.asset_hash}")
    # the image is built for arm64 at deploy
    assets = json.loads((with_runner[2] / "TeamStack.assets.json").read_text())["dockerImages"]
    assert {image["source"]["platform"] for image in assets.values()} == {"linux/arm64"}


def test_the_runner_logs_to_a_log_group_of_its_own_kept_a_month(template) -> None:
    _, definition = the_one(template, "AWS::ECS::TaskDefinition")
    logging = definition["ContainerDefinitions"][0]["LogConfiguration"]
    assert logging["LogDriver"] == "awslogs" and logging["Options"]["awslogs-stream-prefix"] == "runner"
    group = logging["Options"]["awslogs-group"]["Ref"]
    assert template["Resources"][group]["Properties"]["RetentionInDays"] == 30
    assert "Runners" in group


def test_the_task_role_holds_exactly_the_workers_table_and_bucket_grants(template) -> None:
    _, definition = the_one(template, "AWS::ECS::TaskDefinition")
    task_role = definition["TaskRoleArn"]["Fn::GetAtt"][0]
    statements = policy_statements(Template.from_json(template))
    worker = functions_by_role(Template.from_json(template))["worker"]

    def on_table_or_bucket(statement: dict) -> bool:
        return any(a.startswith(("dynamodb:", "s3:")) for a in actions_of(statement))

    workers = [st for st in statements[role_of(worker)] if on_table_or_bucket(st)]
    assert workers and sorted(map(json.dumps, statements[task_role])) == sorted(map(json.dumps, workers))
    trust = template["Resources"][task_role]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert [st["Principal"] for st in trust] == [{"Service": "ecs-tasks.amazonaws.com"}]
    assert not template["Resources"][task_role]["Properties"].get("ManagedPolicyArns")


def test_the_execution_role_pulls_the_image_and_writes_the_runners_log_group_only(template) -> None:
    _, definition = the_one(template, "AWS::ECS::TaskDefinition")
    execution_role = definition["ExecutionRoleArn"]["Fn::GetAtt"][0]
    log_group = definition["ContainerDefinitions"][0]["LogConfiguration"]["Options"]["awslogs-group"]["Ref"]
    statements = policy_statements(Template.from_json(template))[execution_role]
    granted = {action: json.dumps(st["Resource"]) for st in statements for action in actions_of(st)}
    assert set(granted) == {"ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage",
                            "ecr:GetAuthorizationToken", "logs:CreateLogStream", "logs:PutLogEvents"}
    assert "container-assets" in granted["ecr:BatchGetImage"]
    assert granted["ecr:GetAuthorizationToken"] == '"*"'  # it takes no resource
    assert log_group in granted["logs:PutLogEvents"]


def test_only_the_coordinator_may_start_runners_of_that_definition_in_that_cluster(template) -> None:
    functions = functions_by_role(Template.from_json(template))
    definition_id, definition = the_one(template, "AWS::ECS::TaskDefinition")
    cluster_id, _ = the_one(template, "AWS::ECS::Cluster")
    coordinator = role_of(functions["coordinator"])
    run_task = statements_with(template, "ecs:RunTask")
    assert list(run_task) == [coordinator]
    (statement,) = run_task[coordinator]
    assert actions_of(statement) == ["ecs:RunTask"] and statement["Effect"] == "Allow"
    assert statement["Resource"] == {"Ref": definition_id}
    assert statement["Condition"] == {"ArnEquals": {"ecs:cluster": {"Fn::GetAtt": [cluster_id, "Arn"]}}}
    pass_role = statements_with(template, "iam:PassRole")
    assert list(pass_role) == [coordinator]
    (statement,) = pass_role[coordinator]
    assert actions_of(statement) == ["iam:PassRole"]
    assert sorted(map(json.dumps, statement["Resource"])) == sorted(
        json.dumps({"Fn::GetAtt": [definition[arn]["Fn::GetAtt"][0], "Arn"]})
        for arn in ("TaskRoleArn", "ExecutionRoleArn"))
    assert statement["Condition"] == {"StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}}


def test_the_coordinator_knows_where_and_how_to_start_runners(template) -> None:
    functions = functions_by_role(Template.from_json(template))
    definition_id, _ = the_one(template, "AWS::ECS::TaskDefinition")
    cluster_id, _ = the_one(template, "AWS::ECS::Cluster")
    group_id, _ = the_one(template, "AWS::EC2::SecurityGroup")
    subnets = sorted(of_type(template, "AWS::EC2::Subnet"))
    env = functions["coordinator"]["Environment"]["Variables"]
    assert env["COWORKER_RUNNER_CLUSTER"] == {"Fn::GetAtt": [cluster_id, "Arn"]}
    assert env["COWORKER_RUNNER_TASK_DEFINITION"] == {"Ref": definition_id}
    assert env["COWORKER_RUNNER_SUBNETS"] == {"Fn::Join": ["", [{"Ref": subnets[0]}, ",", {"Ref": subnets[1]}]]}
    assert env["COWORKER_RUNNER_SECURITY_GROUPS"] == {"Fn::GetAtt": [group_id, "GroupId"]}
    assert env["COWORKER_RUNNER_PUBLIC_IP"] == "True"  # public subnets without a NAT gateway
    for role in ("coordinator", "worker", "api"):  # the API refuses container work when none may start
        variables = functions[role]["Environment"]["Variables"]
        assert variables["COWORKER_CONTAINER_TYPES"] == "export,reindex", role
        assert variables["COWORKER_MAX_RUNNERS"] == "4", role
    for role in ("worker", "api"):
        assert "COWORKER_RUNNER_TASK_DEFINITION" not in functions[role]["Environment"]["Variables"], role
    # The container types' limits do not size the worker: resize's 600 s do.
    assert functions["worker"]["Timeout"] == 615


def test_the_runner_has_the_workers_environment(with_runner, template) -> None:
    worker = functions_by_role(Template.from_json(template))["worker"]["Environment"]["Variables"]
    runner = runner_environment(template)
    assert {name: runner.get(name) for name in worker} == worker  # the same code, the same settings
    assert runner["COWORKER_HANDLER_MODULES"] == with_runner[3]
    assert runner["AWS_REGION"] == {"Ref": "AWS::Region"}  # Lambda sets it itself; a container must be told
    assert runner["COWORKER_RUNNER_STOP_SECONDS"] == "110.0"  # below the 120-s stop timeout
    assert runner["POWERTOOLS_TRACE_DISABLED"] == "true"
    assert "COWORKER_WORKER_FUNCTION" not in runner and "COWORKER_RUNNER_TASK_DEFINITION" not in runner


def test_the_default_network_is_public_subnets_without_nat_and_with_gateway_endpoints(template) -> None:
    subnets = of_type(template, "AWS::EC2::Subnet")
    assert len(subnets) == 2 and all(s["Properties"]["MapPublicIpOnLaunch"] for s in subnets.values())
    assert of_type(template, "AWS::EC2::NatGateway") == {} and of_type(template, "AWS::EC2::EIP") == {}
    endpoints = [e["Properties"] for e in of_type(template, "AWS::EC2::VPCEndpoint").values()]
    assert {e["VpcEndpointType"] for e in endpoints} == {"Gateway"}
    assert sorted(json.dumps(e["ServiceName"]).rsplit(".", 1)[1].strip('"]}') for e in endpoints) == [
        "dynamodb", "s3"]
    _, flow_log = the_one(template, "AWS::EC2::FlowLog")
    assert flow_log["TrafficType"] == "ALL"
    _, group = the_one(template, "AWS::EC2::SecurityGroup")
    assert "SecurityGroupIngress" not in group
    assert of_type(template, "AWS::EC2::SecurityGroupIngress") == {}


def test_runner_starts_are_graphed_and_a_failed_start_raises_an_alarm(template) -> None:
    alarms = alarms_by_id(Template.from_json(template))
    failed = alarms["RunnerStartFailed"]
    assert alarm_metric(failed)[:3] == (MetricName.RUNNER_START_FAILED, "Coworker", "Sum")
    assert (failed["ComparisonOperator"], failed["Threshold"]) == ("GreaterThanThreshold", 0)
    assert failed["TreatMissingData"] == "notBreaching"
    (topic,) = of_type(template, "AWS::SNS::Topic")
    assert failed["AlarmActions"] == alarms["CoordinatorErrors"]["AlarmActions"] == [{"Ref": topic}]
    assert '"Value": "coworker-TeamStack-Tasks"' in json.dumps(failed)  # this deployment's service dimension
    (dashboard,) = of_type(template, "AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for name in (MetricName.RUNNERS_STARTED, MetricName.RUNNER_START_FAILED, MetricName.BUSY_RUNNERS):
        assert f'\\"Coworker\\",\\"{name}\\",\\"service\\",\\"coworker-TeamStack-Tasks\\"' in body, name


# --- the image -----------------------------------------------------------------------------------


def test_the_build_context_in_the_assembly_holds_the_dockerfile_the_library_the_handlers_and_main(
        with_runner, template) -> None:
    system, _, assembly, name = with_runner
    context = runner_image_context(assembly, template)
    assert context.name == system.runner.image_asset_directory
    assert sorted(p.name for p in context.iterdir()) == sorted(["Dockerfile", "main.py", "coworker", name])
    assert (context / "main.py").read_text() == (c.FUNCTIONS_DIR / "runner" / "main.py").read_text()
    assert (context / "coworker" / "data" / "layout.py").read_text() == (
        c.LAYER_SOURCE_DIR / "coworker" / "data" / "layout.py").read_text()
    assert (context / name / "long_tasks.py").is_file() and (context / name / "reports" / "summary.py").is_file()
    assert not list(context.rglob("__pycache__")) and not list(context.rglob("*.pyc"))
    dockerfile = (context / "Dockerfile").read_text()
    assert f"FROM {c.RUNNER_BASE_IMAGE}\n" in dockerfile and 'CMD ["python", "main.py"]' in dockerfile
    assert "pip install" not in dockerfile  # layerDependencies=skip: the image would lack them, as the layer does
    assert f"COPY {name}/ /app/{name}/" in dockerfile and "USER 65534:65534" in dockerfile


def test_the_image_installs_the_layers_lock_and_the_handlers_requirements_as_lambda_wheels(
        tmp_path, monkeypatch) -> None:
    resolved = "lxml==5.3.0 --hash=sha256:" + "c" * 64 + "\n"
    monkeypatch.setattr("coworker_cdk.runner_image.resolve", lambda text: resolved if "lxml" in text else "")
    package, name = long_tasks_package(tmp_path / "src")
    (package / "requirements.txt").write_text("lxml>=5\n")
    context = RunnerImageContext(c.FUNCTIONS_DIR / "runner", package, install_dependencies=True,
                                 cache=tmp_path / "cache")
    folder = context.prepare()
    assert (folder / "pip-locks" / "layer.lock").read_text() == c.LAYER_LOCK.read_text()
    assert (folder / "pip-locks" / "handlers.lock").read_text() == resolved
    dockerfile = (folder / "Dockerfile").read_text()
    for lock, target in (("layer.lock", "/opt/python"), ("handlers.lock", "/opt/handlers")):
        (line,) = [line for line in dockerfile.splitlines() if line.endswith(f"/tmp/pip-locks/{lock}")]
        assert "--require-hashes" in line and "--no-deps" in line and f"--target {target}" in line
        assert "--only-binary=:all:" in line and f"--python-version {c.PYTHON_VERSION}" in line
        assert [w for w in line.split() if w.startswith("manylinux")] == list(c.PIP_PLATFORMS)
    assert "PYTHONPATH=/opt/handlers:/opt/python" in dockerfile  # your pins first, as in the worker's code
    # Prepared once per content: the same folder again, a new one when the handlers change
    assert context.prepare() == folder
    (package / "long_tasks.py").write_text((package / "long_tasks.py").read_text() + "\n# changed\n")
    changed = RunnerImageContext(c.FUNCTIONS_DIR / "runner", package, install_dependencies=True,
                                 cache=tmp_path / "cache")
    assert changed.prepare() != folder


def test_main_runs_from_the_build_context_as_it_is(with_runner, template, tmp_path) -> None:
    """The context imports its own copy of the library and the handlers: ``python main.py`` there
    reads its settings, loads the handlers, and refuses to start without a start request (exit 2)."""
    _, _, assembly, name = with_runner
    context = runner_image_context(assembly, template)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("COWORKER_", "PYTHON"))}
    env.update({key: value for key, value in runner_environment(template).items() if isinstance(value, str)},
               AWS_REGION="us-east-1", AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x",
               COWORKER_TABLE_NAME="tasks", PYTHONDONTWRITEBYTECODE="1")
    script = ("import runpy, sys; sys.argv = ['main.py']; "
              "import coworker, " + name + "; print(coworker.__file__); print(" + name + ".__file__); "
              "runpy.run_path('main.py', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", script], cwd=context, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    library, handlers = result.stdout.splitlines()[:2]
    assert Path(library).is_relative_to(context) and Path(handlers).is_relative_to(context)
    assert "COWORKER_RUNNER_SLOT" in result.stdout + result.stderr


# --- without container types, and options -----------------------------------------------------


def test_without_container_types_there_is_no_runner_and_no_function_may_start_one(tmp_path) -> None:
    system, template, _ = synth(tmp_path)
    assert system.runner is None
    kinds = {resource["Type"] for resource in template["Resources"].values()}
    assert not {kind for kind in kinds if kind.startswith(("AWS::ECS::", "AWS::EC2::"))}
    assert not statements_with(template, "ecs:RunTask") and not statements_with(template, "iam:PassRole")
    assert "RunnerStartFailed" not in alarms_by_id(Template.from_json(template))
    for role, fn in functions_by_role(Template.from_json(template)).items():
        variables = fn["Environment"]["Variables"]
        assert variables["COWORKER_MAX_RUNNERS"] == "0", role  # the API refuses container work
        assert variables["COWORKER_CONTAINER_TYPES"] == "", role
        assert variables.get("COWORKER_RUNNER_TASK_DEFINITION") is None, role


def test_the_runner_may_be_built_without_container_types_when_asked(tmp_path) -> None:
    system, template, _ = synth(tmp_path, container_runner=True, max_runners=2)
    assert system.runner is not None
    assert len(of_type(template, "AWS::ECS::TaskDefinition")) == 1
    coordinator = functions_by_role(Template.from_json(template))["coordinator"]["Environment"]["Variables"]
    assert (coordinator["COWORKER_MAX_RUNNERS"], coordinator["COWORKER_CONTAINER_TYPES"]) == ("2", "")


def test_the_deployers_subnets_security_groups_and_cluster_are_used_as_given(tmp_path) -> None:
    package, _ = long_tasks_package(tmp_path / "src")
    _, template, _ = synth(tmp_path, handlers=str(package), runner_subnets=",".join(SUBNETS),
                           runner_security_groups=[SECURITY_GROUP], runner_cluster="batch",
                           runner_cpu=2048, runner_memory_mb=8192, runner_threads=2)
    kinds = {resource["Type"] for resource in template["Resources"].values()}
    assert not {kind for kind in kinds if kind.startswith("AWS::EC2::")}  # no VPC, no security group
    assert "AWS::ECS::Cluster" not in kinds
    _, definition = the_one(template, "AWS::ECS::TaskDefinition")
    assert (definition["Cpu"], definition["Memory"]) == ("2048", "8192")
    coordinator = functions_by_role(Template.from_json(template))["coordinator"]
    env = coordinator["Environment"]["Variables"]
    assert env["COWORKER_RUNNER_SUBNETS"] == ",".join(SUBNETS)
    assert env["COWORKER_RUNNER_SECURITY_GROUPS"] == SECURITY_GROUP
    assert env["COWORKER_RUNNER_PUBLIC_IP"] == "False"  # your subnets: a NAT gateway or endpoints reach ECR
    assert env["COWORKER_RUNNER_THREADS"] == "2"
    cluster_arn = env["COWORKER_RUNNER_CLUSTER"]
    assert json.dumps(cluster_arn).endswith(':cluster/batch"]]}')
    (statement,) = statements_with(template, "ecs:RunTask")[role_of(coordinator)]
    assert statement["Condition"] == {"ArnEquals": {"ecs:cluster": cluster_arn}}


def test_a_cluster_given_by_arn_is_used_as_it_is(tmp_path) -> None:
    arn = "arn:aws:ecs:eu-west-1:123456789012:cluster/batch"
    _, template, _ = synth(tmp_path, container_runner="true", runner_cluster=arn)
    assert of_type(template, "AWS::ECS::Cluster") == {}
    coordinator = functions_by_role(Template.from_json(template))["coordinator"]["Environment"]["Variables"]
    assert coordinator["COWORKER_RUNNER_CLUSTER"] == arn
    assert len(of_type(template, "AWS::EC2::VPC")) == 1  # the network is still the stack's


@pytest.mark.parametrize(("options", "message"), [
    ({"runner_cpu": 1024}, "option runner_cpu configures the container runner, which this deployment does not have"),
    ({"max_runners": 3}, "option max_runners configures the container runner"),
    ({"container_runner": "maybe"}, "option container_runner must be true or false"),
    ({"container_runner": True, "runner_cpu": 3000}, "runner_cpu (context runnerCpu) must be one of Fargate's"),
    ({"container_runner": True, "runner_cpu": 256, "runner_memory_mb": 4096},
     "runner_memory_mb (context runnerMemoryMb) is 4096, which Fargate does not allow with runner_cpu 256: it "
     "takes 512, 1024, 2048"),
    ({"container_runner": True, "runner_subnets": SUBNETS[0]}, "runner_subnets and runner_security_groups go together"),
    ({"container_runner": True, "runner_security_groups": SECURITY_GROUP}, "go together"),
    ({"container_runner": True, "runner_subnets": "subnet-nothex", "runner_security_groups": SECURITY_GROUP},
     "option runner_subnets must list ids like subnet-0123abcd"),
    ({"container_runner": True, "runner_public_ip": False}, "has no NAT gateway"),
    ({"container_runner": True, "runner_cluster": "arn:aws:ecs:eu-west-1:123:cluster/x"}, "ECS cluster's name or ARN"),
])
def test_bad_runner_options_fail_at_synth_with_a_clear_error(options, message) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        StackConfig.from_options(handlers="examples", **options)


def test_container_types_cannot_be_deployed_with_the_runner_turned_off(tmp_path) -> None:
    package, _ = long_tasks_package(tmp_path)
    with pytest.raises(ConfigurationError, match=r"container_runner \(context containerRunner\) is false, but task "
                                                 r"type 'export', 'reindex' runs on the container runner"):
        StackConfig.from_options(handlers=str(package), container_runner="false")
    assert StackConfig.from_options(handlers="examples", container_runner=False, max_runners=0).runner is None


def test_context_keys_reach_the_runner(tmp_path) -> None:
    package, _ = long_tasks_package(tmp_path)
    app = App(context={"handlersDir": str(package), "runnerCpu": "512", "runnerMemoryMb": "1024",
                       "maxRunners": "10", "runnerSubnets": ",".join(SUBNETS), "runnerSecurityGroups": SECURITY_GROUP,
                       "runnerPublicIp": "true", "runnerStartSeconds": "300"})
    config = StackConfig.from_context(app.node)
    assert config.runner is not None
    assert (config.runner.cpu, config.runner.memory_mb, config.runner.subnets, config.runner.public_ip) == (
        512, 1024, SUBNETS, True)
    assert (config.settings.max_runners, config.settings.runner_start_seconds) == (10, 300)

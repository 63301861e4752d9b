"""Helpers shared by the infrastructure tests."""

from __future__ import annotations

from pathlib import Path

from coworker_cdk import constants as c

FUNCTION_DIRS = (c.COORDINATOR_DIR_NAME, c.WORKER_DIR_NAME, c.API_DIR_NAME)


def missing_function_code(functions_dir: Path = c.FUNCTIONS_DIR) -> list[str]:
    """Function directories of the stack that have no handler.py yet."""
    return [name for name in FUNCTION_DIRS if not (functions_dir / name / "handler.py").is_file()]


def runner_image_context(assembly_dir: str | Path, template: dict) -> Path:
    """The container runner's image build context in a synthesized assembly (``cdk.out/asset.<hash>``,
    the hash being the image's tag in the task definition). It holds ``Dockerfile``, ``main.py``,
    ``coworker/`` and the handlers package, and runs as it is: ``python main.py`` in that folder, with
    the library's dependencies installed and the container's environment from the template."""
    (task_definition,) = [resource["Properties"] for resource in template["Resources"].values()
                          if resource["Type"] == "AWS::ECS::TaskDefinition"]
    (container,) = task_definition["ContainerDefinitions"]
    tag = container["Image"]["Fn::Sub"].rsplit(":", 1)[1]
    return Path(assembly_dir) / f"asset.{tag}"


def runner_environment(template: dict) -> dict:
    """The runner container's environment in a synthesized template (values may be CloudFormation
    expressions, as in the functions' environments)."""
    (task_definition,) = [resource["Properties"] for resource in template["Resources"].values()
                          if resource["Type"] == "AWS::ECS::TaskDefinition"]
    (container,) = task_definition["ContainerDefinitions"]
    return {variable["Name"]: variable["Value"] for variable in container["Environment"]}

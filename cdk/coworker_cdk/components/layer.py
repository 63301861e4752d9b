"""The layer holding the ``coworker`` library and its runtime dependencies."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import RemovalPolicy
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from coworker_cdk.bundling import layer_code
from coworker_cdk.components.function import ARCHITECTURE, RUNTIME


class CoworkerLayer(Construct):
    """``python/coworker`` plus the wheels of requirements.txt, built without Docker."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        source_dir: Path,
        requirements: Path,
        install_dependencies: bool,
    ) -> None:
        super().__init__(scope, construct_id)
        self.layer = self._build_layer(source_dir, requirements, install_dependencies)

    def _build_layer(
        self, source_dir: Path, requirements: Path, install_dependencies: bool
    ) -> lambda_.LayerVersion:
        return lambda_.LayerVersion(
            self,
            "Layer",
            description="Coworker library and its runtime dependencies",
            code=layer_code(source_dir, requirements, install_dependencies=install_dependencies),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            # Old versions stay so that a rollback can still reference them.
            removal_policy=RemovalPolicy.RETAIN_ON_UPDATE_OR_DELETE,
        )

"""Builds the Lambda layer on this machine, without Docker.

The layer is the ``coworker`` package plus its runtime dependencies, laid out under
``python/`` so Lambda puts it on ``sys.path``. Dependencies are fetched as binary wheels for
the Lambda platform (Linux, arm64, the runtime's Python), whatever machine runs the synth.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_lambda as lambda_

from infra import constants as c


@jsii.implements(ILocalBundling)
class LocalLayerBundling:
    """Copies the package and, unless told not to, pip-installs the requirements for Lambda."""

    def __init__(
        self,
        source_dir: Path,
        requirements: Path,
        *,
        install_dependencies: bool,
        dependency_cache: Path = c.LAYER_DEPENDENCY_CACHE,
    ) -> None:
        self._source_dir = source_dir
        self._requirements = requirements
        self._install_dependencies = install_dependencies
        self._dependency_cache = dependency_cache

    def try_bundle(self, output_dir: str, *, image: DockerImage, **_: object) -> bool:  # noqa: ARG002
        target = Path(output_dir) / "python"
        target.mkdir(parents=True, exist_ok=True)
        if self._install_dependencies:
            shutil.copytree(self._dependencies(), target, dirs_exist_ok=True)
        shutil.copytree(
            self._source_dir / c.LAYER_PACKAGE,
            target / c.LAYER_PACKAGE,
            ignore=shutil.ignore_patterns(*c.ASSET_EXCLUDES),
            dirs_exist_ok=True,
        )
        return True

    def _dependencies(self) -> Path:
        """The installed requirements, from a local cache keyed by what pip was asked for.

        Editing the library re-bundles the layer, but pip only runs when requirements.txt, the
        platform or the Python version change.
        """
        digest = hashlib.sha256(self._pip_key().encode() + self._requirements.read_bytes()).hexdigest()
        cached = self._dependency_cache / digest[:32]
        if cached.is_dir():
            return cached
        self._dependency_cache.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix="partial-", dir=self._dependency_cache))
        try:
            self._pip_install(partial)
            partial.rename(cached)  # atomic: a half-done install is never reused
        except OSError:
            if not cached.is_dir():  # not merely another synth finishing first
                raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        return cached

    @staticmethod
    def _pip_key() -> str:
        return f"{c.PIP_PLATFORM}|{c.PIP_IMPLEMENTATION}|{c.PYTHON_VERSION}"

    def _pip_install(self, target: Path) -> None:
        command = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-compile",
            "--requirement",
            str(self._requirements),
            "--target",
            str(target),
            "--platform",
            c.PIP_PLATFORM,
            "--implementation",
            c.PIP_IMPLEMENTATION,
            "--python-version",
            c.PYTHON_VERSION,
            "--only-binary=:all:",
        ]
        # pip's own output goes to stderr so that it never mixes with the assembly on stdout.
        subprocess.run(command, check=True, stdout=sys.stderr)

    def asset_hash(self) -> str:
        """Hash of everything that goes into the layer, so an unchanged layer is not rebuilt.

        With a custom hash, CDK reuses an already bundled ``cdk.out/asset.<hash>`` directory
        instead of running pip again on every synth.
        """
        digest = hashlib.sha256()
        digest.update(f"{self._install_dependencies}|{self._pip_key()}".encode())
        digest.update(self._requirements.read_bytes())
        package = self._source_dir / c.LAYER_PACKAGE
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                digest.update(str(path.relative_to(package)).encode())
                digest.update(path.read_bytes())
        return digest.hexdigest()


def layer_code(source_dir: Path, requirements: Path, *, install_dependencies: bool) -> lambda_.Code:
    """Asset code of the layer, bundled locally (Docker is never started)."""
    bundler = LocalLayerBundling(source_dir, requirements, install_dependencies=install_dependencies)
    return lambda_.Code.from_asset(
        str(source_dir),
        asset_hash_type=AssetHashType.CUSTOM,
        asset_hash=bundler.asset_hash(),
        bundling=BundlingOptions(
            # Required by the API; only used if local bundling declined, which it never does.
            image=DockerImage.from_registry("public.ecr.aws/sam/build-python" + c.PYTHON_VERSION),
            local=bundler,
        ),
    )

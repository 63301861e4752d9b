"""Builds Lambda code on this machine, without Docker: the layer and the worker's code.

The layer is the ``coworker`` package plus its runtime dependencies, laid out under
``python/`` so Lambda puts it on ``sys.path``. The worker's code is its handler module plus your
handlers package and that package's own requirements, at the root of the function's code.
Dependencies are fetched as binary wheels for the Lambda platform (Linux, arm64, the runtime's
Python), whatever machine runs the synth, and cached by what pip was asked for.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_lambda as lambda_

from infra import constants as c


def has_requirements(requirements: Path | None) -> bool:
    """True when ``requirements`` exists and names at least one requirement (not only comments)."""
    if requirements is None or not requirements.is_file():
        return False
    lines = (line.split("#", 1)[0].strip() for line in requirements.read_text().splitlines())
    return any(lines)


@jsii.implements(ILocalBundling)
class LocalBundling:
    """Copies folders into the asset and, unless told not to, pip-installs requirements for Lambda.

    ``parts`` are ``(source folder, path inside the asset)``; dependencies go to
    ``dependencies_dir`` inside the asset (``python`` for a layer, ``.`` for a function).
    """

    def __init__(
        self,
        parts: Sequence[tuple[Path, str]],
        requirements: Path | None,
        *,
        install_dependencies: bool,
        dependencies_dir: str = ".",
        dependency_cache: Path = c.LAYER_DEPENDENCY_CACHE,
    ) -> None:
        self._parts = list(parts)
        self._requirements = requirements if has_requirements(requirements) else None
        self._install_dependencies = install_dependencies
        self._dependencies_dir = dependencies_dir
        self._dependency_cache = dependency_cache

    def try_bundle(self, output_dir: str, *, image: DockerImage, **_: object) -> bool:  # noqa: ARG002
        output = Path(output_dir)
        if self._install_dependencies and self._requirements is not None:
            target = output / self._dependencies_dir
            target.mkdir(parents=True, exist_ok=True)
            shutil.copytree(self._dependencies(self._requirements), target, dirs_exist_ok=True)
        for source, inside in self._parts:
            shutil.copytree(source, output / inside, ignore=shutil.ignore_patterns(*c.ASSET_EXCLUDES),
                            dirs_exist_ok=True)
        return True

    def _dependencies(self, requirements: Path) -> Path:
        """The installed requirements, from a local cache keyed by what pip was asked for.

        Editing the code re-bundles the asset, but pip only runs when the requirements, the
        platform or the Python version change.
        """
        digest = hashlib.sha256(self._pip_key().encode() + requirements.read_bytes()).hexdigest()
        cached = self._dependency_cache / digest[:32]
        if cached.is_dir():
            return cached
        self._dependency_cache.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix="partial-", dir=self._dependency_cache))
        try:
            self._pip_install(requirements, partial)
            partial.rename(cached)  # atomic: a half-done install is never reused
        except OSError:
            if not cached.is_dir():  # not merely another synth finishing first
                raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        return cached

    @staticmethod
    def _pip_key() -> str:
        return f"{','.join(c.PIP_PLATFORMS)}|{c.PIP_IMPLEMENTATION}|{c.PYTHON_VERSION}"

    @staticmethod
    def _pip_install(requirements: Path, target: Path) -> None:
        command = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-compile",
            "--requirement",
            str(requirements),
            "--target",
            str(target),
            *(flag for platform in c.PIP_PLATFORMS for flag in ("--platform", platform)),
            "--implementation",
            c.PIP_IMPLEMENTATION,
            "--python-version",
            c.PYTHON_VERSION,
            "--only-binary=:all:",
        ]
        # pip's own output goes to stderr so that it never mixes with the assembly on stdout.
        subprocess.run(command, check=True, stdout=sys.stderr)

    def asset_hash(self) -> str:
        """Hash of everything that goes into the asset, so an unchanged one is not rebuilt.

        With a custom hash, CDK reuses an already bundled ``cdk.out/asset.<hash>`` directory
        instead of running pip again on every synth.
        """
        digest = hashlib.sha256()
        digest.update(f"{self._install_dependencies}|{self._pip_key()}|{self._dependencies_dir}".encode())
        if self._requirements is not None:
            digest.update(self._requirements.read_bytes())
        for source, inside in self._parts:
            digest.update(f"part:{inside}".encode())
            for path in sorted(source.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                    digest.update(str(path.relative_to(source)).encode())
                    digest.update(path.read_bytes())
        return digest.hexdigest()

    def code(self, source_dir: Path) -> lambda_.Code:
        """Asset code bundled by this object (Docker is never started); ``source_dir`` is only
        what CDK records as the asset's origin."""
        return lambda_.Code.from_asset(
            str(source_dir),
            asset_hash_type=AssetHashType.CUSTOM,
            asset_hash=self.asset_hash(),
            bundling=BundlingOptions(
                # Required by the API; only used if local bundling declined, which it never does.
                image=DockerImage.from_registry("public.ecr.aws/sam/build-python" + c.PYTHON_VERSION),
                local=self,
            ),
        )


def layer_bundling(source_dir: Path, requirements: Path, *, install_dependencies: bool,
                   dependency_cache: Path = c.LAYER_DEPENDENCY_CACHE) -> LocalBundling:
    """The layer: ``python/coworker`` and the wheels of ``requirements`` under ``python/``."""
    return LocalBundling([(source_dir / c.LAYER_PACKAGE, f"python/{c.LAYER_PACKAGE}")], requirements,
                         install_dependencies=install_dependencies, dependencies_dir="python",
                         dependency_cache=dependency_cache)


def function_bundling(function_dir: Path, handlers_dir: Path | None, *, install_dependencies: bool,
                    dependency_cache: Path = c.LAYER_DEPENDENCY_CACHE) -> LocalBundling:
    """A function that imports your handlers (the worker, and the API, which checks task types):
    its handler module, your handlers package (as ``<name>/``) and the wheels of the package's
    ``requirements.txt``, all at the root of the function's code."""
    parts = [(function_dir, ".")]
    requirements = None
    if handlers_dir is not None:
        parts.append((handlers_dir, handlers_dir.name))
        requirements = handlers_dir / c.HANDLER_REQUIREMENTS
    return LocalBundling(parts, requirements, install_dependencies=install_dependencies,
                         dependency_cache=dependency_cache)


def layer_code(source_dir: Path, requirements: Path, *, install_dependencies: bool) -> lambda_.Code:
    """Asset code of the layer, bundled on this machine."""
    return layer_bundling(source_dir, requirements, install_dependencies=install_dependencies).code(source_dir)


def function_code(function_dir: Path, handlers_dir: Path | None, *, install_dependencies: bool) -> lambda_.Code:
    """Asset code of a function with your handlers package, bundled on this machine."""
    bundling = function_bundling(function_dir, handlers_dir, install_dependencies=install_dependencies)
    return bundling.code(function_dir)

"""Builds Lambda code on this machine, without Docker: the layer and the worker's code.

The layer is the ``coworker`` package plus its runtime dependencies, laid out under
``python/`` so Lambda puts it on ``sys.path``. The worker's code is its handler module plus your
handlers package and that package's own requirements, at the root of the function's code.
Dependencies are fetched as binary wheels for the Lambda platform (Linux, arm64, the runtime's
Python), whatever machine runs the synth, and installed from a lock: exact versions and wheel
hashes. The layer's lock is committed (``layer.lock``, made by ``python -m coworker_cdk.lock``);
a handlers package's ``requirements.txt`` is resolved at synth. The asset hash and the wheel
cache follow the lock, not the requirements' text: a new release of a dependency makes a new
asset, and two machines that resolve alike build the same one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_lambda as lambda_

from coworker_cdk import constants as c

LOCK_SUFFIX = ".lock"
_PIP = (sys.executable, "-m", "pip", "--disable-pip-version-check")


def platform_flags() -> list[str]:
    """pip's flags for Lambda's platform: every wheel tag its runtime takes, its Python, wheels only."""
    return [*(flag for platform in c.PIP_PLATFORMS for flag in ("--platform", platform)),
            "--implementation", c.PIP_IMPLEMENTATION, "--python-version", c.PYTHON_VERSION, "--only-binary=:all:"]


@functools.lru_cache(maxsize=16)
def resolve(requirements: str) -> str:
    """``requirements`` resolved for Lambda's platform, as a lock: one ``name==version
    --hash=sha256:...`` line per wheel pip would install, sorted by name."""
    with tempfile.TemporaryDirectory(prefix="coworker-resolve-") as work:
        folder = Path(work)
        (folder / "requirements.txt").write_text(requirements)
        subprocess.run([*_PIP, "install", "--quiet", "--dry-run", "--ignore-installed", "--report",
                        str(folder / "report.json"), "--target", str(folder / "target"), *platform_flags(),
                        "--requirement", str(folder / "requirements.txt")], check=True, stdout=sys.stderr)
        report = json.loads((folder / "report.json").read_text())
    lines = []
    for item in report["install"]:
        metadata, hashes = item["metadata"], item["download_info"].get("archive_info", {}).get("hashes", {})
        if "sha256" not in hashes:
            raise RuntimeError(f"pip resolved {metadata['name']} without a sha256 hash: it cannot be locked")
        lines.append(f"{metadata['name']}=={metadata['version']} --hash=sha256:{hashes['sha256']}")
    return "".join(f"{line}\n" for line in sorted(lines, key=str.lower))


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
        # What pip installs: a committed lock as it is, else the requirements resolved now.
        self._lock: str | None = None
        if install_dependencies and self._requirements is not None:
            self._lock = (self._requirements.read_text() if self._requirements.suffix == LOCK_SUFFIX
                          else resolve(self._requirements.read_text()))
        self._dependencies_dir = dependencies_dir
        self._dependency_cache = dependency_cache

    def try_bundle(self, output_dir: str, *, image: DockerImage, **_: object) -> bool:  # noqa: ARG002
        output = Path(output_dir)
        if self._lock is not None:
            target = output / self._dependencies_dir
            target.mkdir(parents=True, exist_ok=True)
            shutil.copytree(self._dependencies(self._lock), target, dirs_exist_ok=True)
        for source, inside in self._parts:
            shutil.copytree(source, output / inside, ignore=shutil.ignore_patterns(*c.ASSET_EXCLUDES),
                            dirs_exist_ok=True)
        return True

    def _dependencies(self, lock: str) -> Path:
        """The installed lock, from a local cache keyed by the lock, the platform and the Python.

        Editing the code re-bundles the asset, but pip only runs when what it installs changes.
        """
        digest = hashlib.sha256(self._pip_key().encode() + lock.encode()).hexdigest()
        cached = self._dependency_cache / digest[:32]
        if cached.is_dir():
            return cached
        self._dependency_cache.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix="partial-", dir=self._dependency_cache))
        try:
            self._pip_install(lock, partial)
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
    def _pip_install(lock: str, target: Path) -> None:
        """Exactly the lock's wheels (no resolution: ``--no-deps``; each checked against its hash)."""
        lock_file = target.with_suffix(LOCK_SUFFIX)
        lock_file.write_text(lock)
        try:
            command = [*_PIP, "install", "--quiet", "--no-compile", "--no-deps", "--require-hashes",
                       "--requirement", str(lock_file), "--target", str(target), *platform_flags()]
            # pip's own output goes to stderr so that it never mixes with the assembly on stdout.
            subprocess.run(command, check=True, stdout=sys.stderr)
        finally:
            lock_file.unlink(missing_ok=True)

    def asset_hash(self) -> str:
        """Hash of everything that goes into the asset, so an unchanged one is not rebuilt.

        With a custom hash, CDK reuses an already bundled ``cdk.out/asset.<hash>`` directory
        instead of running pip again on every synth.
        """
        digest = hashlib.sha256()
        digest.update(f"{self._install_dependencies}|{self._pip_key()}|{self._dependencies_dir}".encode())
        if self._lock is not None:
            digest.update(self._lock.encode())
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

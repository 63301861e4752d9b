"""The container runner's image: a Docker build context prepared at synth, without Docker.

The context holds what the Lambda worker runs, laid out for a container::

    Dockerfile
    main.py                  functions/runner/main.py: `python main.py` runs one runner
    coworker/                the library, from the same source as the layer
    <your package>/          your handlers package
    pip-locks/layer.lock     the layer's lock (exact versions, wheel hashes)
    pip-locks/handlers.lock  your requirements.txt, resolved at synth as for the worker

The Dockerfile installs each lock as the layer's bundling does (the same Linux arm64 wheels for the
same Python, each checked against its hash): the library's dependencies under ``/opt/python``,
yours under ``/opt/handlers`` (ahead of them on the path, as a function's code is ahead of its
layer). The code goes to ``/app`` and the runner runs there as an unprivileged user. Since
``main.py``'s folder comes first on ``sys.path``, the context also runs as it is: ``python
main.py`` in it, with the library's dependencies installed (the rehearsal tests do that).

``cdk synth`` only writes the folder (CDK copies it into the cloud assembly as the image asset);
``cdk deploy`` builds the image with Docker for linux/arm64 and pushes it.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from coworker_cdk import constants as c
from coworker_cdk.bundling import has_requirements, platform_flags, resolve

DOCKERFILE = "Dockerfile"
LOCKS_DIR = "pip-locks"  # not an identifier: never the name of a handlers package
LAYER_LOCK_NAME = "layer.lock"
HANDLERS_LOCK_NAME = "handlers.lock"
APP_DIR = "/app"
LIBRARY_DEPENDENCIES_DIR = "/opt/python"
HANDLER_DEPENDENCIES_DIR = "/opt/handlers"
RUNNER_USER = "65534:65534"  # nobody: the code and its dependencies are read-only to it


class RunnerImageContext:
    """The build context of one runner image: the files it is made of, and the folder they go to.

    ``install_dependencies`` false (``layerDependencies=skip``, tests) leaves the locks out: such an
    image could not run, as the layer and the functions of such a synth cannot.
    """

    def __init__(
        self,
        runner_dir: Path,
        handlers_dir: Path | None,
        *,
        install_dependencies: bool,
        source_dir: Path = c.LAYER_SOURCE_DIR,
        layer_lock: Path = c.LAYER_LOCK,
        cache: Path = c.RUNNER_IMAGE_CACHE,
    ) -> None:
        self._parts: list[tuple[Path, str]] = [(runner_dir, "."), (source_dir / c.LAYER_PACKAGE, c.LAYER_PACKAGE)]
        if handlers_dir is not None:
            self._parts.append((handlers_dir, handlers_dir.name))
        locks: dict[str, str] = {}
        if install_dependencies:
            locks[LAYER_LOCK_NAME] = layer_lock.read_text()
            requirements = handlers_dir / c.HANDLER_REQUIREMENTS if handlers_dir is not None else None
            if requirements is not None and has_requirements(requirements):
                locks[HANDLERS_LOCK_NAME] = resolve(requirements.read_text())
        self._files = {f"{LOCKS_DIR}/{name}": text for name, text in locks.items()}
        # What the image copies: the runner's own files one by one (the context's root holds the rest too).
        code = sorted(path.name + ("/" if path.is_dir() else "") for path in runner_dir.iterdir()
                      if not _excluded(Path(path.name)))
        code += [f"{inside}/" for _, inside in self._parts[1:]]
        self._files[DOCKERFILE] = dockerfile(sorted(locks), code)
        self._cache = cache

    @property
    def files(self) -> dict[str, str]:
        """The generated files, by their path inside the context."""
        return dict(self._files)

    def digest(self) -> str:
        """Hash of everything the context holds: the name of its folder."""
        digest = hashlib.sha256()
        for name, text in sorted(self._files.items()):
            digest.update(f"file:{name}\0".encode() + text.encode())
        for source, inside in self._parts:
            digest.update(f"part:{inside}\0".encode())
            for path in sorted(source.rglob("*")):
                if path.is_file() and not _excluded(path.relative_to(source)):
                    digest.update(f"{path.relative_to(source)}\0".encode() + path.read_bytes())
        return digest.hexdigest()

    def prepare(self) -> Path:
        """The context's folder, written once per content (``~/.cache/coworker-cdk/runner-image/``)
        and reused by later synths while nothing in it changes."""
        folder = self._cache / self.digest()[:32]
        if folder.is_dir():
            return folder
        self._cache.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix="partial-", dir=self._cache))
        try:
            for source, inside in self._parts:
                shutil.copytree(source, partial / inside, ignore=shutil.ignore_patterns(*c.ASSET_EXCLUDES),
                                dirs_exist_ok=True)
            for name, text in self._files.items():
                (partial / name).parent.mkdir(parents=True, exist_ok=True)
                (partial / name).write_text(text)
            partial.rename(folder)  # atomic: a half-written context is never used
        except OSError:
            if not folder.is_dir():  # not merely another synth finishing first
                raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        return folder


def dockerfile(locks: Sequence[str], code: Sequence[str]) -> str:
    """The runner's Dockerfile: the locks installed (``locks``: names in ``pip-locks/``), then the
    code (``code``: paths in the context, folders ending in ``/``), run as ``python main.py``."""
    flags = " ".join(platform_flags())
    targets = {LAYER_LOCK_NAME: LIBRARY_DEPENDENCIES_DIR, HANDLERS_LOCK_NAME: HANDLER_DEPENDENCIES_DIR}
    lines = [
        "# Coworker's container runner, written by coworker_cdk at synth (coworker_cdk/runner_image.py).",
        f"FROM {c.RUNNER_BASE_IMAGE}",
        "ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \\",
        f"    PYTHONPATH={HANDLER_DEPENDENCIES_DIR}:{LIBRARY_DEPENDENCIES_DIR}",
    ]
    if locks:
        lines.append(f"COPY {LOCKS_DIR}/ /tmp/{LOCKS_DIR}/")
    for name in locks:
        # Exactly the lock's wheels, for the platform and Python the lock was made for (no resolution).
        lines.append(f"RUN pip install --quiet --no-deps --require-hashes --target {targets[name]} {flags} "
                     f"--requirement /tmp/{LOCKS_DIR}/{name}")
    lines.append(f"WORKDIR {APP_DIR}")
    lines += [f"COPY {inside} {APP_DIR}/{inside}" for inside in code]
    lines += [
        # Byte code compiled once here: the unprivileged user cannot write it, and every start would compile.
        f"RUN python -m compileall -q {APP_DIR}",
        f"USER {RUNNER_USER}",
        f'CMD ["python", "{c.RUNNER_MAIN}"]',
        "",
    ]
    return "\n".join(lines)


def _excluded(relative: Path) -> bool:
    return any(shutil.ignore_patterns(*c.ASSET_EXCLUDES)("", [part]) for part in relative.parts)

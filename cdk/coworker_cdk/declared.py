"""What task types declare, read from the handlers' source at synth, without running it: their
time limits and the runner they ask for.

``@task_handler("convert", timeout_seconds=600)`` and ``@task_handler("export", runner="container")``
are read from each module of the handlers package (test modules excepted, as the worker skips
them) and from the example handlers when they are deployed. A time limit may be a number, a
module-level name bound to one, or arithmetic of those (``10 * MINUTE``); a runner is the string
``"container"`` or ``"lambda"``. Anything else is refused with the file and line, since synth does
not import your code (its requirements need not be installed where ``cdk`` runs).

Which runner runs a type is the library's rule (:func:`coworker.engine.runners.runner_of`),
applied here to the declarations: the container runner for a type that asks for it, or whose
limit is longer than a Lambda worker gives and that does not ask for Lambda.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import operator
from collections.abc import Callable, Iterator
from pathlib import Path

from coworker.config import Settings
from coworker.engine import timing
from coworker.engine.handlers import RUNNERS, check_timeout
from coworker.errors import ConfigurationError

_DECORATOR = "task_handler"
_EXAMPLES_MODULE = "coworker.engine.examples"
_OPERATORS: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
}


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What one ``@task_handler(...)`` says beyond its type: its limit and runner, if any."""

    task_type: str
    where: str  # file:line
    timeout_seconds: float | None = None
    runner: str | None = None


@dataclasses.dataclass(frozen=True)
class Runners:
    """The deployed task types by runner: the container runner's, and the Lambda types' limits."""

    container_types: tuple[str, ...] = ()
    lambda_limits: dict[str, float] = dataclasses.field(default_factory=dict)


def declarations(handlers_dir: Path | None, examples: bool) -> dict[str, Declaration]:
    """Task type -> its declaration, for every type that declares a limit or a runner."""
    files: list[Path] = []
    if examples:
        spec = importlib.util.find_spec(_EXAMPLES_MODULE)
        if spec is not None and spec.origin is not None:
            files.append(Path(spec.origin))
    if handlers_dir is not None:
        files.extend(sorted(path for path in handlers_dir.rglob("*.py") if not _is_test_file(path, handlers_dir)))
    return {declaration.task_type: declaration for path in files for declaration in _declarations_in(path)}


def declared_limits(handlers_dir: Path | None, examples: bool) -> dict[str, float]:
    """Task type -> declared time limit, for every type that declares one."""
    return {name: d.timeout_seconds for name, d in declarations(handlers_dir, examples).items()
            if d.timeout_seconds is not None}


def runners_of(handlers_dir: Path | None, examples: bool, settings: Settings) -> Runners:
    """The deployed types split by runner; a type that asks for Lambda with a limit no Lambda
    worker gives is refused, naming it and where it says so."""
    longest = timing.lambda_max_task_seconds(settings)
    container: list[str] = []
    lambda_limits: dict[str, float] = {}
    refused: list[Declaration] = []
    for name, declared in sorted(declarations(handlers_dir, examples).items()):
        beyond = declared.timeout_seconds is not None and declared.timeout_seconds > longest
        if declared.runner == "container" or (beyond and declared.runner is None):
            container.append(name)
        elif beyond:
            refused.append(declared)
        elif declared.timeout_seconds is not None:
            lambda_limits[name] = declared.timeout_seconds
    if refused:
        named = ", ".join(f"{d.task_type!r} ({d.timeout_seconds:g} s, {d.where})" for d in refused)
        raise ConfigurationError(
            f'task type {named} says runner="lambda" but declares a time limit longer than a Lambda worker can '
            f"give: at most {longest:g} s, since a Lambda function runs at most {timing.LAMBDA_MAX_TIMEOUT_SECONDS} "
            's; drop runner="lambda" (a longer limit runs on the container runner), or lower its timeout_seconds')
    return Runners(tuple(container), lambda_limits)


def _is_test_file(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).with_suffix("").parts
    return any(part.startswith("test_") or part in ("tests", "test", "conftest") for part in parts)


def _declarations_in(path: Path) -> Iterator[Declaration]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read handler module {path}: {exc}") from None
    names = _module_numbers(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _called_name(node.func) == _DECORATOR and node.args):
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg in ("timeout_seconds", "runner")}
        timeout, runner = keywords.get("timeout_seconds"), keywords.get("runner")
        if _is_none(timeout) and _is_none(runner):
            continue
        first, where = node.args[0], f"{path}:{node.lineno}"
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            raise ConfigurationError(f"{where}: a task type that declares timeout_seconds or runner must be named by "
                                     "a string literal, so that the stack can read it without running your code")
        task_type = first.value
        limit = None
        if not _is_none(timeout):
            assert timeout is not None
            value = _number(timeout, names)
            if value is None:
                raise ConfigurationError(
                    f"{where}: timeout_seconds of task type {task_type!r} must be a number, a module-level name "
                    "bound to one, or arithmetic of those, so that the stack can read it without running your code")
            limit = check_timeout(value, f"{where}: task type {task_type!r}")
        yield Declaration(task_type, where, limit, None if _is_none(runner) else _runner(runner, where, task_type))


def _is_none(node: ast.expr | None) -> bool:
    return node is None or (isinstance(node, ast.Constant) and node.value is None)


def _runner(node: ast.expr | None, where: str, task_type: str) -> str:
    """A runner named by a string literal, one of the library's runners."""
    allowed = " or ".join(repr(name) for name in RUNNERS)
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        raise ConfigurationError(f"{where}: runner of task type {task_type!r} must be the string {allowed}, so "
                                 "that the stack can read it without running your code")
    if node.value not in RUNNERS:
        raise ConfigurationError(f"{where}: runner of task type {task_type!r} must be {allowed}, not {node.value!r}")
    return node.value


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _module_numbers(tree: ast.Module) -> dict[str, float]:
    """Module-level names bound once to a number (or arithmetic of earlier ones)."""
    names: dict[str, float] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        else:
            continue
        if isinstance(target, ast.Name):
            number = _number(value, names)
            if number is not None:
                names[target.id] = number
    return names


def _number(node: ast.expr, names: dict[str, float]) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _number(node.left, names), _number(node.right, names)
        if left is None or right is None or (isinstance(node.op, ast.Div) and right == 0):
            return None
        return _OPERATORS[type(node.op)](left, right)
    return None

"""The time limits task types declare, read from the handlers' source at synth, without running it.

``@task_handler("convert", timeout_seconds=600)`` is read from each module of the handlers
package (test modules excepted, as the worker skips them) and from the example handlers when
they are deployed. The value may be a number, a module-level name bound to one, or arithmetic of
those (``10 * MINUTE``); anything else is refused with the file and line, since synth does not
import your code (its requirements need not be installed where ``cdk`` runs).
"""

from __future__ import annotations

import ast
import importlib.util
import operator
from collections.abc import Callable, Iterator
from pathlib import Path

from coworker.engine.handlers import check_timeout
from coworker.errors import ConfigurationError

_DECORATOR = "task_handler"
_EXAMPLES_MODULE = "coworker.engine.examples"
_OPERATORS: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
}


def declared_limits(handlers_dir: Path | None, examples: bool) -> dict[str, float]:
    """Task type -> declared time limit, for every type that declares one."""
    files: list[Path] = []
    if examples:
        spec = importlib.util.find_spec(_EXAMPLES_MODULE)
        if spec is not None and spec.origin is not None:
            files.append(Path(spec.origin))
    if handlers_dir is not None:
        files.extend(sorted(path for path in handlers_dir.rglob("*.py") if not _is_test_file(path, handlers_dir)))
    limits: dict[str, float] = {}
    for path in files:
        for task_type, limit in _limits_in(path):
            limits[task_type] = limit
    return limits


def _is_test_file(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).with_suffix("").parts
    return any(part.startswith("test_") or part in ("tests", "test", "conftest") for part in parts)


def _limits_in(path: Path) -> Iterator[tuple[str, float]]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read handler module {path}: {exc}") from None
    names = _module_numbers(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _called_name(node.func) == _DECORATOR and node.args):
            continue
        first = node.args[0]
        timeout = next((k.value for k in node.keywords if k.arg == "timeout_seconds"), None)
        if timeout is None:
            continue
        where = f"{path}:{node.lineno}"
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            raise ConfigurationError(f"{where}: a task type that declares timeout_seconds must be named by a "
                                     "string literal, so that the stack can read it without running your code")
        value = _number(timeout, names)
        if value is None:
            raise ConfigurationError(
                f"{where}: timeout_seconds of task type {first.value!r} must be a number, a module-level name "
                "bound to one, or arithmetic of those, so that the stack can read it without running your code")
        limit = check_timeout(value, f"{where}: task type {first.value!r}")
        assert limit is not None
        yield first.value, limit


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

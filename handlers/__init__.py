"""Your task handlers: the package that `cdk deploy` bundles into the worker Lambda.

Every module in this folder is imported when a worker (or the local runtime) starts, so a
function decorated with ``@task_handler("your-type")`` in any of them is a task type; nothing
else needs editing. Modules named ``test_*``, ``tests`` and ``conftest`` are left out. Third-party
packages your handlers import go in ``requirements.txt`` next to this file: the stack installs
them into the worker (binary wheels for Lambda's arm64 Python), and ``make run`` installs them
into the local environment. See "Writing task handlers" in the README.
"""

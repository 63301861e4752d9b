"""A local container runner: the runner's entry point (:func:`coworker.engine.runner.main`, as
the image runs it), in a process that dies with the runtime that started it."""

from coworker.engine.runner import main

from coworker_local.environments import terminate_with_parent

if __name__ == "__main__":
    terminate_with_parent()  # SIGTERM when the runtime is gone: the runner's stop, as ECS's
    raise SystemExit(main())

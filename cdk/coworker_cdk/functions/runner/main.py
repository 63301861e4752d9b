"""Container runner (ECS Fargate): started by the coordinator with RunTask, its request (slot,
token, keys) in the environment; runs container work until none is due, then exits."""

from coworker.engine.runner import main

if __name__ == "__main__":
    raise SystemExit(main())

"""An example of your own handler (shown in the README; a test runs the README's copy)."""

from coworker import TaskContext, TaskFailed, task_handler


@task_handler("charge-order")
def charge_order(payload: dict, context: TaskContext) -> dict:
    """Charge an order once: the task key is the payment's idempotency key."""
    amount = payload["amount_cents"]
    if amount <= 0:  # bad input: retrying will not help, so the task is ignored at once
        raise TaskFailed(f"order {payload['order']}: amount must be positive", retryable=False)
    # payments.charge(payload["order"], amount, idempotency_key=context.key) would go here.
    return {"order": payload["order"], "charged_cents": amount, "attempt": context.attempt}

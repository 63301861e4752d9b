"""Powertools Logger, Metrics and Tracer shared by the library and the Lambda handlers.

Service name, namespace and log level come from the standard Powertools environment
variables (POWERTOOLS_SERVICE_NAME, POWERTOOLS_METRICS_NAMESPACE, POWERTOOLS_LOG_LEVEL).
The tracer disables itself outside Lambda; set POWERTOOLS_METRICS_DISABLED=true to keep EMF
lines out of a local terminal.
"""

from __future__ import annotations

import os

from aws_lambda_powertools import Logger, Metrics, Tracer

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "coworker")
NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "Coworker")

logger = Logger(service=SERVICE)
metrics = Metrics(service=SERVICE, namespace=NAMESPACE)
tracer = Tracer(service=SERVICE)


class MetricName:
    """Metric names, shared with the CloudWatch dashboard in infra/."""

    CLAIMED = "TaskClaimed"
    NOT_CLAIMED = "TaskNotClaimed"
    FINISHED = "TaskFinished"
    FAILED = "TaskFailed"
    IGNORED = "TaskIgnored"
    LOST_CLAIM = "LostClaim"
    LOST_CLAIM_SIGNALLED = "LostClaimSignalled"  # a heartbeat found the claim taken over
    SLOT_TAKEN_OVER = "WorkerSlotTakenOver"  # a dispatched worker found its slot given away
    FEED_PAGES = "WorkerFeedQueries"
    DURATION = "TaskDuration"
    DISPATCHED = "TasksDispatched"
    WORKER_INVOCATIONS = "WorkerInvocations"
    BUSY_SLOTS = "BusyWorkerSlots"
    RUNNING_TASKS = "RunningTasks"  # tasks holding a live lock, counted exactly by each tick
    BACKLOG = "DueTasks"  # due tasks the coordinator saw (capped; see dispatch.BACKLOG_CAP)
    OLDEST_DUE_AGE = "OldestDueTaskAge"  # seconds the oldest due task seen by a tick has waited
    REAPED = "TasksReaped"
    DISPATCHED_ON_SUBMIT = "WorkersStartedOnSubmit"

"""What a deployment asks of the AWS account it goes into: its Lambda concurrency, in one place.

The synth's check (:class:`coworker_cdk.config.StackConfig`, against the quota the deployer states)
and ``coworker preflight`` (against the quota the account reports) both ask here, so the two
cannot disagree. No CDK import: the preflight loads this module without loading the CDK.
"""

from __future__ import annotations

from typing import Final

from coworker.config import Settings

from coworker_cdk import constants as c

# Service Quotas' code of Lambda's "Concurrent executions" quota (per account and region).
LAMBDA_CONCURRENCY_QUOTA_CODE: Final = "L-B99A9384"


def reserved_concurrency(settings: Settings) -> int:
    """Concurrent executions a deployment reserves: the worker slots (``ceil(max_concurrency /
    batch_size)``) and the coordinator. The API function reserves none."""
    return settings.worker_slots + c.COORDINATOR_RESERVED_CONCURRENCY


def required_lambda_quota(settings: Settings) -> int:
    """The account concurrency quota a deployment needs: what it reserves, plus the
    executions Lambda keeps unreserved (it refuses a reservation that would leave fewer)."""
    return reserved_concurrency(settings) + c.LAMBDA_UNRESERVED_MINIMUM


def max_concurrency_within(quota: int, batch_size: int) -> int:
    """The largest ``max_concurrency`` whose reservations a ``quota`` holds at ``batch_size``;
    0 when the quota holds not even one worker slot."""
    slots = quota - c.LAMBDA_UNRESERVED_MINIMUM - c.COORDINATOR_RESERVED_CONCURRENCY
    return max(0, slots) * batch_size

"""The completion events' own bus (events=eventbridge, no eventBus named): the bus, its archive,
the accounts and the organization its policy lets put events, and a dead-letter queue for
consumers' rules.

The stack makes no rule: what reacts to Task Ignored or Batch Completed is the consumer's (its
pattern, its target, its retry policy). A consumer's rule on this bus names the delivery DLQ
in its target's ``DeadLetterConfig``; the queue's policy lets only rules on this bus send to it,
and an alarm fires on its first message. docs/events.md says how.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from coworker_cdk import constants as c

EVENTS_SERVICE = "events.amazonaws.com"


class CompletionEventBus(Construct):
    """A custom bus for Coworker's events, archived (unless ``archive_days`` is None), with its
    delivery dead-letter queue.

    The bus and its archive go with the stack whatever the removal policy: the bus holds no
    events, a bus's name cannot be taken again while a retained one has it (the next deploy would
    fail), and an archive replays only to its own bus. With the customer-managed key (option
    kms_key_arn) the bus, its archive and the queue are encrypted with it; its policy must then
    let EventBridge (events.amazonaws.com) use it (docs/deploy.md, Regulated accounts).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        archive_days: int | None,
        accounts: Sequence[str] = (),
        organization_id: str | None = None,
        removal_policy: RemovalPolicy,
        key: kms.IKey | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self._key = key
        self.bus = events.EventBus(self, "Bus", description="Coworker completion events (docs/events.md)",
                                   kms_key=key)
        # No archive (archive_days None) means no replay: a consumer that misses events has lost them.
        self.archive = self._build_archive(archive_days) if archive_days is not None else None
        if accounts:
            self._allow_accounts(accounts)
        if organization_id:
            self._allow_organization(organization_id)
        self.dead_letter_queue = self._build_dead_letter_queue(removal_policy)

    def _build_archive(self, days: int) -> events.Archive:
        # Every event on the bus (Coworker's and whatever the allowed accounts put): an empty
        # prefix matches every source. 0 days keeps them for ever, as EventBridge reads it.
        return events.Archive(
            self,
            "Archive",
            source_event_bus=self.bus,
            description="Every event on Coworker's bus, for replay (docs/events.md)",
            event_pattern=events.EventPattern(source=events.Match.prefix("")),
            retention=Duration.days(days),
            kms_key=self._key,
        )

    def _allow_accounts(self, accounts: Sequence[str]) -> None:
        """The bus's resource policy: these accounts may put events on it (a rule of theirs that
        targets it, or their own PutEvents)."""
        self.bus.add_to_resource_policy(iam.PolicyStatement(
            sid="OtherAccountsPutEvents",
            principals=[iam.AccountPrincipal(account) for account in accounts],
            actions=["events:PutEvents"],
            resources=[self.bus.event_bus_arn],
        ))

    def _allow_organization(self, organization_id: str) -> None:
        """The bus's resource policy: principals of this AWS organization may put events on it, as
        an account of eventBusAccounts may (Principal "*" held to the organization by aws:PrincipalOrgID,
        so an account that joins it later needs no deploy)."""
        self.bus.add_to_resource_policy(iam.PolicyStatement(
            sid="OrganizationPutEvents",
            principals=[iam.OrganizationPrincipal(organization_id)],
            actions=["events:PutEvents"],
            resources=[self.bus.event_bus_arn],
        ))

    def _build_dead_letter_queue(self, removal_policy: RemovalPolicy) -> sqs.Queue:
        queue = sqs.Queue(
            self,
            "DeliveryDeadLetterQueue",
            # EventBridge cannot use the AWS-managed KMS key (aws/sqs): SQS's own, or the customer's.
            encryption=sqs.QueueEncryption.KMS if self._key else sqs.QueueEncryption.SQS_MANAGED,
            encryption_master_key=self._key,
            enforce_ssl=True,
            retention_period=Duration.days(c.EVENT_DLQ_RETENTION_DAYS),
            removal_policy=removal_policy,
        )
        rules_on_bus = Stack.of(self).format_arn(
            service="events", resource="rule", resource_name=f"{self.bus.event_bus_name}/*")
        queue.add_to_resource_policy(iam.PolicyStatement(
            sid="RulesOnCoworkerBusDeadLetter",
            principals=[iam.ServicePrincipal(EVENTS_SERVICE)],
            actions=["sqs:SendMessage"],
            resources=[queue.queue_arn],
            conditions={"ArnLike": {"aws:SourceArn": rules_on_bus}},
        ))
        return queue

"""The prices and the named assumptions behind ``benchmarks/bill.py``: us-east-1 list prices as
published on the AWS pricing pages on PRICES_AS_OF (no free tier applied, to any design), and what
each design is assumed to do. Check them before you rely on a figure; docs/cost.md gives the
sources. Importing this module has no side effect (the stack's tests read it)."""

from __future__ import annotations

from coworker import capacity

PRICES_AS_OF = "2026-11-01"
HOURS_A_MONTH = 730

# DynamoDB on-demand (request units) and storage: aws.amazon.com/dynamodb/pricing/on-demand
DYNAMODB_WRITE_UNIT = 0.625 / 1e6
DYNAMODB_READ_UNIT = 0.125 / 1e6
DYNAMODB_GB_MONTH = 0.25
DYNAMODB_STREAMS_READ = 0.02 / 1e5  # GetRecords requests
# Lambda, arm64 (Coworker's functions run on Graviton): aws.amazon.com/lambda/pricing
LAMBDA_REQUEST = 0.20 / 1e6
LAMBDA_GB_SECOND_ARM = 0.0000133334
LAMBDA_MAX_SECONDS = 900
# Lambda writes START, END and REPORT lines per invocation (about this many bytes).
LAMBDA_PLATFORM_LOG_BYTES = 350
API_GATEWAY_REST_REQUEST = 3.50 / 1e6  # aws.amazon.com/api-gateway/pricing
# S3 Standard requests: aws.amazon.com/s3/pricing (a payload kept in the bucket: one PUT when it is
# put, one GET each time a worker runs it)
S3_PUT = 0.005 / 1000
S3_GET = 0.0004 / 1000
SQS_REQUEST = 0.40 / 1e6  # standard queue, per 64 KB request: aws.amazon.com/sqs/pricing
# Step Functions: aws.amazon.com/step-functions/pricing
STEP_FUNCTIONS_TRANSITION = 0.025 / 1000  # standard workflow state transition
EXPRESS_REQUEST = 1.00 / 1e6  # express workflow execution (a Distributed Map child)
EXPRESS_GB_SECOND = 0.00001667  # express duration, billed in 64 MB steps
EXPRESS_MAX_SECONDS = 300
# Fargate, Linux/ARM (Graviton), on-demand: aws.amazon.com/fargate/pricing. Billed per second from
# the start of the image pull until the task stops, at least a minute a task; 20 GB of ephemeral
# storage included. AWS Batch adds no charge of its own on Fargate: aws.amazon.com/batch/pricing
FARGATE_VCPU_HOUR_ARM = 0.03238
FARGATE_GB_HOUR_ARM = 0.00356
FARGATE_MIN_SECONDS = 60
# Fargate launches at most 20 tasks a second per account and region (a burst of 100): the task
# launch rate quota, docs.aws.amazon.com/AmazonECS/latest/developerguide/throttling.html
FARGATE_LAUNCHES_PER_SECOND = 20
# A public IPv4 address, which a Fargate task in a public subnet holds while it runs (the stack's
# own network for runners: public subnets, no NAT gateway): aws.amazon.com/vpc/pricing. Assumed
# prorated by the second, as the task is.
PUBLIC_IPV4_HOUR = 0.005
# CloudWatch: aws.amazon.com/cloudwatch/pricing
CLOUDWATCH_LOGS_GB = 0.50  # ingestion
CLOUDWATCH_METRIC_MONTH = 0.30  # a custom metric (first 10,000), prorated by the hours it is sent
CLOUDWATCH_ALARM_METRIC_MONTH = 0.10  # a standard-resolution alarm, per metric it reads
CLOUDWATCH_DASHBOARD_MONTH = 3.00  # beyond the account's first three
KMS_KEY_MONTH = 1.00  # a customer managed key (aws.amazon.com/kms/pricing); its requests here are few
XRAY_TRACE = 5.00 / 1e6  # traces recorded
XRAY_SAMPLED = 0.05  # the default sampling rule keeps about 5% (plus 1 per second)

# Coworker's stack as `cdk deploy` makes it (tests/infra/test_stack.py checks these against the
# synthesized template): the metrics its alarms read (the throttle alarm reads 4, the ignored
# share 2, the stream follower's lag 1, failed slot upkeep 1), its dashboard, its KMS keys (the alarm topic's), the
# coordinator's memory and schedule.
STACK_ALARM_METRICS = 14
STACK_DASHBOARDS = 1
STACK_KMS_KEYS = 1
COORDINATOR_MEMORY_GB = 256 / 1024
COORDINATOR_RUNS_A_MONTH = HOURS_A_MONTH * 60  # EventBridge, once a minute

# Assumptions, named.
DYNAMODB_SECONDS_PER_REQUEST = 0.008  # one round trip to DynamoDB from Lambda in the same region
LAMBDA_RUN_OVERHEAD_SECONDS = 0.05  # a warm invocation's own time beyond its round trips
DYNAMODB_SECONDS_PER_TASK = capacity.DYNAMODB_SECONDS_PER_TASK  # claim + finish round trips, on AWS
COWORKER_FEED_SHARE = 0.9  # a worker keeps taking work until 10% of its timeout remains
STATUS_TABLE_WRITES = 3  # the SQS design's status table: put, "running", "done" (no index)
SQS_REQUESTS_PER_TASK = 0.3  # send, receive, delete, each in batches of 10
SQS_LAMBDA_BATCH = 10  # messages per invocation (the event source mapping's batch size)
# An idle queue: Lambda's event source mapping polls it with 5 pollers, 20-s long polls.
SQS_IDLE_RECEIVES_A_MONTH = 5 * 3 * 60 * HOURS_A_MONTH
DISTRIBUTED_MAP_BATCHES = (1, 10, 100, 1000)  # item batch sizes a child may take
STANDARD_CHILD_TRANSITIONS = 2  # a Standard child workflow with one Task state
ITEM_BYTES = 350  # a task item, for storage
# A Fargate task's billed seconds beyond its work: the image pull (a few hundred MB from ECR in the
# region), the container's start to its first task, and its stop. Each Fargate design pays it per
# Fargate task: Coworker once per runner, Distributed Map and Batch once per item or job.
FARGATE_START_SECONDS = 40
# The container runner's size, and every Fargate design's: 1 vCPU / 2 GB, arm64 (--fargate-vcpu,
# --fargate-memory-gb). Lambda gives a function one vCPU at 1,769 MB (docs.aws.amazon.com/lambda,
# "Configuring memory").
RUNNER_VCPU = 1.0
RUNNER_MEMORY_GB = 2.0
LAMBDA_ONE_VCPU_MB = 1769

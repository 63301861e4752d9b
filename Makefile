.PHONY: test run bench soak synth lint bill lock released-template

test:  ## install what is needed, run every test
	scripts/test.sh

run:  ## the whole system on this machine, with a demo workload
	scripts/run-local.sh

bench:  ## benchmarks: capacity units (cost.py), tasks/s against the peer (throughput.py) and against raw replays of each side's writes (replay.py), dispatch latency, utilisation, duplicates, recovery (dispatch.py), the whole system under slow writes and SIGKILLs (chaos.py)
	scripts/bootstrap.sh --bench && .venv/bin/python benchmarks/cost.py && .venv/bin/python benchmarks/throughput.py \
		&& .venv/bin/python benchmarks/replay.py && .venv/bin/python benchmarks/dispatch.py && .venv/bin/python benchmarks/chaos.py

bill:  ## the bill for 1,000,000 tasks beside SQS + Lambda and Distributed Map (bill.py), and the scale model (scale_model.py: the template as deployed, then 1,000 tasks/s)
	scripts/bootstrap.sh --bench && .venv/bin/python benchmarks/bill.py && .venv/bin/python benchmarks/scale_model.py

soak:  ## the scale run (soak.py): 100,000 tasks through the whole local system beside the peer, a tenth at a time, then 1,000,000 put alone; smaller: make soak SOAK_ARGS="--tasks 2000 --ingest-only-tasks 10000"
	scripts/bootstrap.sh --bench && .venv/bin/python benchmarks/soak.py $(SOAK_ARGS)

synth:  ## synthesize the CloudFormation template offline
	scripts/bootstrap.sh && AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x AWS_DEFAULT_REGION=us-east-1 \
		JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=18,20 JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION=1 \
		CDK_DISABLE_VERSION_CHECK=1 PATH="$(CURDIR)/.venv/bin:$$PATH" npx cdk synth --quiet

lint:  ## ruff on everything; mypy on the production package (the Lambda layer) and the local tooling
	scripts/bootstrap.sh && .venv/bin/ruff check . && .venv/bin/mypy

lock:  ## resolve requirements.txt for Lambda's platform into the layer's lock (commit cdk/coworker_cdk/layer.lock)
	scripts/bootstrap.sh && PYTHONPATH=cdk:layers/coworker/python .venv/bin/python -m coworker_cdk.lock requirements.txt

released-template:  ## snapshot a released commit's template for the upgrade rehearsal: make released-template COMMIT=<sha>
	@test -n "$(COMMIT)" || { echo "usage: make released-template COMMIT=<released commit>"; exit 2; }
	scripts/bootstrap.sh && .venv/bin/python scripts/released_template.py $(COMMIT)

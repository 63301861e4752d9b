"""The whole system on one machine: embedded DynamoDB, the API over HTTP, the coordinator on a
timer, worker invocations in their own processes, a web dashboard and a demo workload.

Run it with ``python -m coworker_local`` (or ``make run``); see docs/local.md.
Nothing here is used on AWS.
"""

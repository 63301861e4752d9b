"""The data layer: the one DynamoDB table and everything that talks to it.

``layout`` (keys, index, item kinds, shards), ``models`` (every pynamodb model), ``connection``
(binding and the shared client), ``writes`` (conditional and transactional writes, DynamoDB's
error codes read once) and ``index`` (reads of the sharded status index). Nothing here imports
the engine or the API.
"""

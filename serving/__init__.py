"""The serving worker (`python -m serving`): engines, stable/canary slots, batching, request logs.

Clients of a running worker: `serving.client.BinaryClient` (framed TCP) and
`serving.fleet.FleetClient` (admin operations across many workers). The worker never imports
tasks or flows.
"""

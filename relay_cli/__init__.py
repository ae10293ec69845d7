"""The `relay` console command: the demo and seeding, and read-only looks into the model store.

It sits above `flows/` in the import order (the demo starts a flow); `flows/` holds flows only.
"""

"""The simulated shop: seeded e-commerce traffic for the embedded demo and tests."""

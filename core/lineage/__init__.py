"""Lineage queries over stored versions."""

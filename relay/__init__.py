"""Relay: safe, observable ML model releases. The shared kernel lives here."""

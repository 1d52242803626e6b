"""Adapters: storage and target implementations of the ports, wired in by ``dpone.config``."""

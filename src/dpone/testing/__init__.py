"""Test helpers shipped with dpone: conformance suites adapters subclass, crash tooling."""

"""Recovery: read-only inspection and audited operator actions."""

"""The commit protocol: run algorithm, leases, failpoints. Imports ports, never adapters."""

"""Partition publication: reconcile, publish, read and clean up staging generations."""

"""An example third-party dpone connector (see docs/connector-fence-guide.md)."""

"""The dpone command line."""

"""Object store adapters: a local directory and S3-compatible storage."""

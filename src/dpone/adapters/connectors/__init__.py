"""Target connectors: each one writes rows and proves, through its fence, whether they committed."""

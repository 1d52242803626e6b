"""File sources: a content-hash snapshot identity and rows streamed in batches."""

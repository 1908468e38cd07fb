"""Storage formats: one module per format, each with a writer and a reader of the same shape."""

"""Game records on disk (ArrayRecord shards), dataset preparation, and training batches."""

"""Training: one cell's loop (train), its models, data, precisions, measurements and launch over processes."""

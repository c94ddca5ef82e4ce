"""The environment: software record, GPU sanity checks, conda preflight, the apex build, GPU slots, peak."""

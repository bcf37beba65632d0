"""The prolog and the epilog: fast path, policy gate, membership, readiness, teardown, per-job state, metrics."""

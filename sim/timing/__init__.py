"""Step time: the cost model, engine profiles and their fit, the profiler, fidelity against
a live engine, tensor parallelism's share of the work, and dollars."""

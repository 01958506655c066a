"""CUDA-graph sizes for a workload (``stepplan buckets``): the steps' demand, the exact size
optimizer, predicted step time and graph memory, the search and its table."""

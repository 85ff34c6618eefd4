"""The worker's data path: page copies, transfer streams, pinned host rows (torch only).

`pages` (views of vLLM's paged caches, checked at start-up), `copier` (one job's page copies
as one batch), `streams` (transfer streams and events), `hostmem` (the DRAM slot pool and SSD
staging rows, pinned through torch), `ssd_load` (a load's SSD read pipeline). Imports and
runs without vLLM, which names nowhere: the worker (vllm_glue/worker.py) drives it and
passes in vLLM's copy op where there is one. tests/test_layers.py checks this, and
benchmarks/gpu_check.py runs it on a GPU machine with torch and Triton alone.
"""

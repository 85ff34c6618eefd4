"""The worker's data path: page copies, transfer streams, pinned host rows (torch only).

`copier` (one job's page copies as one batch), `streams` (transfer streams and events),
`hostmem` (the DRAM slot pool and SSD staging rows). Imports and runs without vllm; vLLM's
copy op and host registration are used where present. tests/test_layers.py checks this.
"""

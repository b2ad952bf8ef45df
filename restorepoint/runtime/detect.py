"""What this machine runs, detected (never copied from a restore point): the version terms of
the installed torch and of the GPUs it sees (spec section 16, "The local view")."""

from __future__ import annotations

__all__ = ["TORCH_TERMS_SOURCE", "torch_terms"]

TORCH_TERMS_SOURCE = "detected: torch and CUDA versions"


def torch_terms() -> dict[str, str]:
    """``torch``: the installed version (without a local ``+cpu``/``+cu124`` suffix); ``cuda``:
    the CUDA runtime torch was built with, where it has one; ``cuda.capability``: the compute
    capabilities of the GPUs present (``8.0``, or ``8.0,9.0`` for a mixed machine), where there
    are any. A CPU-only machine has the ``torch`` term alone."""
    import torch

    terms = {"torch": torch.__version__.split("+")[0]}
    if torch.version.cuda:
        terms["cuda"] = str(torch.version.cuda)
    if torch.cuda.is_available():
        capabilities = {
            "{}.{}".format(*torch.cuda.get_device_capability(i))
            for i in range(torch.cuda.device_count())
        }
        terms["cuda.capability"] = ",".join(sorted(capabilities))
    return terms

"""The PyTorch training runtime (``restorepoint.torch`` is its public face). Imports nothing
heavy here: torch is loaded by the modules that need it."""

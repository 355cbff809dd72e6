"""Deprecated alias of momfmm.pt (a checkpoint as a PyTorch nn.Module), kept for one release.

`import momfmm.torch` warns (DeprecationWarning, attributed to the importing line) and gives
momfmm.pt itself: the same module object, so every name works as before. The old name read as
PyTorch's own `torch`; import momfmm.pt instead.
"""
import sys
import warnings

from momfmm import pt

# stacklevel 2: the importing line (warnings skips the import machinery's frames)
warnings.warn("momfmm.torch is deprecated and will be removed in the next release: import momfmm.pt "
              "(the same functions) instead", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = pt

"""autotune: an autonomous, correctness-gated tuner for LLM inference servers.

Everyday names are re-exported here; everything else lives in one module per concern
(see docs/ARCHITECTURE.md).
"""

from autotune.errors import AutotuneError, SpecError
from autotune.space.load import load_space
from autotune.space.model import SearchSpace
from autotune.spec.load import load_spec
from autotune.spec.model import StudySpec

__all__ = ["AutotuneError", "SearchSpace", "SpecError", "StudySpec", "load_space", "load_spec"]
__version__ = "0.1.0"

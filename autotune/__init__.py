"""autotune: an autonomous, correctness-gated tuner for LLM inference servers.

Everyday names are re-exported here; everything else lives in one module per concern
(see docs/design/architecture.md).
"""

from autotune.errors import AutotuneError, SpecError
from autotune.space import SearchSpace, load_space
from autotune.spec import StudySpec, load_spec

__all__ = ["AutotuneError", "SearchSpace", "SpecError", "StudySpec", "load_space", "load_spec"]
__version__ = "0.1.0"

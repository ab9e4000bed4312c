"""``autotune report``: one self-contained HTML page of a study (:func:`write_report`), its
figures (plots.py), shared formatting (format.py) and the step-time section (profile.py).
"""

from __future__ import annotations

from autotune.report.html import write_report

__all__ = ["write_report"]

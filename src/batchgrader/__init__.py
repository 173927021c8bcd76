"""BatchGrader: grade large text datasets with LLMs at batch prices, unattended.

``import batchgrader as bg``: :func:`bg.grade`, :func:`bg.job` and :class:`bg.Job` (docs/python.md).
They import nothing until called, so this import stays cheap and has no side effect."""

from batchgrader.api import Job, grade, job

__version__ = "0.1.0"

__all__ = ["Job", "__version__", "grade", "job"]

"""BatchGrader: grade large text datasets with LLMs at batch prices, unattended."""

__version__ = "0.1.0"

"""cli: the ``bgctl`` command.  Thin click commands over library calls (``commands``) and the
terminal rendering of their results (``render``, ``render_status``).  No business logic here.
"""

from batchgrader.cli.commands import main

__all__ = ["main"]

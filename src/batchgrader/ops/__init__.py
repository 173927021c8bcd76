"""ops: running BatchGrader as a service and checking that it can run.

``service`` renders and installs the systemd unit or launchd plist; ``doctor`` is
``bgctl doctor``: read-only checks, each with a concrete fix.
"""

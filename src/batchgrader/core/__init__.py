"""core: what every other layer stands on, with no I/O beyond reading settings and the home.

Four groups, in a layer contract of their own (pyproject.toml): ``core.log`` (the event records,
their declarations and the pure fold into job state), ``core.configuration`` (each setting
declared once, profiles, the providers' facts), ``core.rules`` (the pure rules over both: what to
do next, when, how a job ends) and ``core.host`` (the home folder, its lock, the keys file).
"""

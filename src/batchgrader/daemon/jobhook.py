"""Effects of a job's end that never change the job: the ``on_job_end`` command (the HTML report's
name is :func:`~batchgrader.pipeline.outbox.report_name`, re-exported here).

The command runs in a thread of its own (the engine does not wait for it), through the shell,
with the job's figures in ``BG_*`` environment variables and without any API key: every variable
the config reads a key from (:func:`~batchgrader.core.configuration.config.secret_env_names`, also when
``secrets.env`` set it) and every variable holding a key's value is left out.  Its output
and exit status go to the daemon log; after ``timeout`` seconds its whole process group is
killed.  Nothing it does is reported back to the engine: a failing command never affects the
job.  The engine records ``JobEndHookStarted`` before starting it, so it runs at most once per
end of a job, also across crashes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from batchgrader.core.configuration.config import secret_env_names
from batchgrader.pipeline.outbox import report_name as report_name  # re-exported

log = logging.getLogger("batchgrader.jobhook")


def hook_env(job: Any) -> dict[str, str]:
    """The ``BG_*`` variables for a folded ended job."""
    return {
        "BG_JOB_ID": job.job_id,
        "BG_JOB_STATE": job.state,
        "BG_RESULT_PATH": job.result_path or "",
        "BG_ERROR_PATH": job.error_path or "",
        "BG_COST_USD": f"{job.cost_usd:.6f}",
        "BG_INPUT_FILE": job.file,
    }


def _run(command: str, env: dict[str, str], timeout: float, job_id: str) -> None:
    try:
        proc = subprocess.Popen(
            command,
            shell=True,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        log.warning("on_job_end for job %s could not start: %s", job_id, exc)
        return
    try:
        out, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        out, _ = proc.communicate()
        timed_out = True
    for line in (out or b"").decode("utf-8", errors="replace").splitlines():
        log.info("on_job_end %s: %s", job_id, line)
    if timed_out:
        log.warning("on_job_end for job %s was killed after %.1f s", job_id, timeout)
    elif proc.returncode:
        log.warning("on_job_end for job %s exited with status %s (the job is not affected)", job_id, proc.returncode)
    else:
        log.info("on_job_end for job %s finished", job_id)


def hook_environment(
    variables: Mapping[str, str], secrets: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The command's environment: the daemon's, less every key variable the config knows and
    every variable whose value is one of ``secrets`` (the keys in use), plus ``variables``."""
    names = secret_env_names()
    values = {s for s in secrets if s}
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if k not in names and v not in values}
    env.update(variables)
    return env


def start_hook(command: str, variables: Mapping[str, str], timeout: float, secrets: Iterable[str] = ()) -> threading.Thread:
    """Start ``command`` in a (non-daemon) thread: a ``daemon --once`` exit waits for it."""
    env = hook_environment(variables, secrets)
    t = threading.Thread(
        target=_run, args=(command, env, timeout, variables.get("BG_JOB_ID", "")), name="on_job_end", daemon=False
    )
    t.start()
    return t

"""Fault injection: seeded profiles (FaultRates) and precisely scripted faults (Fault)."""

from __future__ import annotations

import fnmatch
import random
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FaultRates:
    """Probabilities per API request (drawn from the seeded generator, in arrival order)."""

    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_503: float = 0.0
    drop_before: float = 0.0  # connection closed before the call took effect
    drop_after: float = 0.0  # the call took effect, then the connection closed without a response
    slow: float = 0.0  # probability of a delayed response
    slow_delay_s: tuple[float, float] = (0.05, 0.3)
    retry_after_s: float = 1.0  # sent with 429/503 as retry-after (s) and retry-after-ms


FAULT_PROFILES: dict[str, FaultRates] = {
    "none": FaultRates(),
    "flaky": FaultRates(rate_429=0.08, rate_500=0.04, rate_503=0.04),
    "drops": FaultRates(drop_before=0.05, drop_after=0.05),
    "slow": FaultRates(slow=0.3),
    "chaos": FaultRates(rate_429=0.06, rate_500=0.03, rate_503=0.03, drop_before=0.04, drop_after=0.04, slow=0.2),
}

FAULT_KINDS = ("status", "drop_before", "drop_after", "delay", "hang_after", "truncate", "garbage", "garble_line", "ended_reply")


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    kind:
      ``status``      answer ``status`` with an OpenAI error body (plus retry-after headers when
                      ``retry_after`` is set) without performing the call;
      ``drop_before`` close the connection without a response, call NOT performed;
      ``drop_after``  perform the call, then close the connection without a response;
      ``delay``       wait ``seconds`` before handling the call normally;
      ``hang_after``  perform the call, then wait ``seconds`` before responding (client timeouts);
      ``truncate``    perform the call, send the headers and half of the body, then close;
      ``garbage``     perform the call, answer 200 with a body that is not JSON.
      ``garble_line`` perform the call; in a file's content, replace the first line by one that
                      is not JSON (a malformed output file whose other lines are good).
      ``ended_reply`` a batch create: perform it, wait until the batch has ended (at most
                      ``seconds``, 10 when 0), then answer with the batch as it is then, its
                      result files left out (a server that validates and runs a batch before
                      its create reply returns; the files are named on a retrieve).
    """

    kind: str
    status: int = 500
    retry_after: float | None = None
    seconds: float = 0.0
    message: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r} (one of {', '.join(FAULT_KINDS)})")


class Faults:
    """Scripted and seeded faults, chosen per API request, and the count of those injected."""

    def __init__(self, rates: FaultRates, seed: int, lock: threading.RLock) -> None:
        self.rates = rates
        self.rng = random.Random(f"faults:{seed}")
        self.lock = lock
        self.scripted: list[dict[str, Any]] = []
        self.injected: Counter[str] = Counter()

    def script_fault(self, method: str, path: str, fault: Fault, times: int = 1) -> None:
        with self.lock:
            self.scripted.append({"method": method.upper(), "path": path, "fault": fault, "times": times})

    def clear_faults(self) -> None:
        with self.lock:
            self.scripted.clear()

    def choose_faults(self, method: str, route: str, path: str) -> list[Fault]:
        with self.lock:
            for s in self.scripted:
                if s["method"] not in ("*", method):
                    continue
                if not (fnmatch.fnmatchcase(route, s["path"]) or fnmatch.fnmatchcase(path, s["path"])):
                    continue
                s["times"] -= 1
                if s["times"] <= 0:
                    self.scripted.remove(s)
                self.injected[s["fault"].kind] += 1
                return [s["fault"]]
            r = self.rates
            if r == FaultRates():
                return []
            out: list[Fault] = []
            u_slow = self.rng.random()
            delay = self.rng.uniform(*r.slow_delay_s)
            u = self.rng.random()
            if u_slow < r.slow:
                out.append(Fault("delay", seconds=delay))
            cum = 0.0
            for rate, fault in (
                (r.rate_429, Fault("status", status=429, retry_after=r.retry_after_s)),
                (r.rate_500, Fault("status", status=500)),
                (r.rate_503, Fault("status", status=503, retry_after=r.retry_after_s)),
                (r.drop_before, Fault("drop_before")),
                (r.drop_after, Fault("drop_after")),
            ):
                cum += rate
                if u < cum:
                    out.append(fault)
                    break
            for f in out:
                self.injected[f.kind if f.kind != "status" else f"status_{f.status}"] += 1
            return out

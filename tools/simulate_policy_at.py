"""Run the ``keyorder simulate`` scenarios against the scaling policy of another commit.

The scenario suite proves the current policy; this shows what it caught in an older one (the
"before" column of docs/operator.md). The older ``operator/`` is extracted with ``git archive`` into a
temporary folder and imported instead of the working tree's; a thin shim fills what the simulator
reads and the older policy did not have (a decision's cause, recommendation and caveat; the
``pods_expected`` argument; recommend-only mode).

    .venv/bin/python -m tools.simulate_policy_at b981eb8 [SCENARIO ...]
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import types
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    commit, names = argv[0], set(argv[1:])
    folder = Path(tempfile.mkdtemp(prefix="keyorder-policy-"))
    archive = subprocess.run(["git", "archive", commit, "operator"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    sys.path.insert(0, str(folder / "operator"))
    for name in [module for module in sys.modules if module.startswith("keyorder_operator")]:
        del sys.modules[name]
    import keyorder_operator.observe as old_observe
    import keyorder_operator.policy as old_policy
    import keyorder_operator.spec as old_spec
    import keyorder_operator.status as old_status

    if not hasattr(old_status, "memory_after"):  # no recommend-only mode then: the decision's state
        old_status.memory_after = lambda decision, spec: old_status.state_to_status(decision.state)  # type: ignore[attr-defined]
    if not hasattr(old_spec, "ScalingMode"):
        old_spec.ScalingMode = types.SimpleNamespace(RECOMMEND="recommend")  # type: ignore[attr-defined]
        old_spec.ScalingSpec.mode = "apply"  # type: ignore[attr-defined]

    from keyorder.devtools.groupsim import driver
    from keyorder.devtools.groupsim.criteria import failures, measure
    from keyorder.devtools.groupsim.scenarios import SCENARIOS

    class Decision:
        """The older decision with what the simulator reads."""

        def __init__(self, inner: Any) -> None:
            self._inner = inner
            grew, changed = inner.target.capacity > inner.before.capacity, inner.target != inner.before
            self.cause = types.SimpleNamespace(value="scale_up" if grew else "scale_down" if changed else "steady")
            self.recommended = getattr(inner, "recommended", None)
            self.caveat = getattr(inner, "caveat", None)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    def observation_from(previous: Any, sample: Any, pods: Any, rollout: bool, paused: bool, **_: Any) -> Any:
        return old_observe.observation_from(previous, sample, pods, rollout, paused)

    driver.decide = lambda *args: Decision(old_policy.decide(*args))  # type: ignore[assignment]
    driver.observation_from = observation_from  # type: ignore[assignment]
    held = 0
    chosen = [scenario for scenario in SCENARIOS if not names or scenario.name in names]
    for scenario in chosen:
        missed = failures(measure(driver.run(scenario, seed=1)))
        held += not missed
        print(f"{scenario.name:<24} {'held' if not missed else 'FAILED: ' + ' | '.join(missed)}")
    print(f"policy at {commit}: {held} of {len(chosen)} scenarios held every criterion")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

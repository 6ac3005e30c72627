"""``keyorder catchup --preflight``: can this image run catch-up at all? Checked without Kafka or Spark.

A catch-up Job replaces the consumer pods: the operator stops them first. An image that cannot run
``keyorder catchup`` (no Java 17+, no PySpark, a handler that does not import) would stop them for
nothing. So the operator first runs this pre-flight in a short Job of the same image, environment and
account (``keyorder_operator.image_check``), and stops the pods only when it passes. It touches no
Kafka group and starts no Spark session: it runs ``java -version``, imports the Python packages the
driver needs, loads the handler as a Spark task would and reads the ``KEYORDER_*`` variables as the driver
will (``settings.environment_problem``).

The decisions (``java_check``, ``packages_check``, ``handler_check``, ``exit_status``) are pure: they
read what the I/O (``run_java``, ``import_packages``, ``load``) found. One line per check is printed
(``ok`` or ``FAIL``, the check, what was found); the status is 0 when all pass, else
``exits.EXIT_CONFIG`` (2), the driver's "refused before touching the group".
"""

from __future__ import annotations

import importlib
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from keyorder.catchup.entrypoint import java_executable
from keyorder.catchup.exits import EXIT_CONFIG

MIN_JAVA = 17
"""Spark 4 runs on Java 17 or later."""
MIN_PYSPARK = 4
"""The reader is a Spark 4 Python Data Source (``keyorder_kafka_ranges``)."""
DRIVER_PACKAGES = ("pyspark", "pandas", "pyarrow")
"""The Python packages ``keyorder catchup`` refuses to start without (``pip install 'keyorder[catchup]'``)."""
JAVA_SECONDS = 60.0
"""How long ``java -version`` may take (a JVM starts in well under a second; a hung one fails the check)."""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.name}: {self.detail}"


@dataclass(frozen=True)
class JavaRun:
    """What running ``<java> -version`` gave: ``error`` when it could not run at all."""

    command: str
    exit_code: int | None = None
    output: str = ""
    error: str | None = None


def java_major(output: str) -> int | None:
    """The major version in ``java -version``'s output: ``"17.0.15"`` -> 17, ``"1.8.0_292"`` -> 8,
    ``"21-ea"`` -> 21; ``None`` if it names none."""
    found = re.search(r'version "([^"]+)"', output)
    if found is None:
        return None
    parts = re.findall(r"\d+", found.group(1))
    if not parts:
        return None
    major = int(parts[0])
    return int(parts[1]) if major == 1 and len(parts) > 1 else major


def java_check(run: JavaRun) -> Check:
    """A Java 17+ runtime answered ``-version`` (the one Spark would start: ``$JAVA_HOME/bin/java``, else ``java``)."""
    if run.error is not None:
        return Check("java", False, f"{run.command} could not run: {run.error} (install a Java {MIN_JAVA}+ runtime)")
    first = next((line.strip() for line in run.output.splitlines() if line.strip()), "no output")
    if run.exit_code != 0:
        return Check("java", False, f"{run.command} -version exited with {run.exit_code}: {first}")
    major = java_major(run.output)
    if major is None:
        return Check("java", False, f"{run.command} -version names no version: {first}")
    if major < MIN_JAVA:
        return Check("java", False, f"{run.command} is Java {major}; Spark 4 needs Java {MIN_JAVA}+ ({first})")
    return Check("java", True, f"Java {major} ({run.command}: {first})")


def packages_check(found: Mapping[str, str | None], errors: Mapping[str, str]) -> Check:
    """PySpark 4 and the packages the driver needs import: ``found`` maps each to its version (``None``
    when it has none), ``errors`` each one that failed to the error."""
    if errors:
        failed = "; ".join(f"{name}: {error}" for name, error in errors.items())
        return Check("pyspark", False, f"{failed} (pip install 'keyorder[catchup]', the image's catchup target)")
    version = found.get("pyspark") or ""
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else None
    if major is None or major < MIN_PYSPARK:
        shown = version or "(no version)"
        return Check("pyspark", False, f"pyspark {shown}; keyorder catchup needs PySpark {MIN_PYSPARK}")
    return Check("pyspark", True, ", ".join(f"{name} {found[name] or '?'}" for name in found))


def handler_check(path: str | None, error: str | None) -> Check:
    """The handler ``path`` loaded (``error``: why it did not)."""
    if not path:
        return Check("handler", False, "none given (--handler or KEYORDER_HANDLER)")
    if error is not None:
        return Check("handler", False, error)
    return Check("handler", True, f"{path} loads")


def environment_check(problem: tuple[str, str] | None) -> Check:
    """The job's ``KEYORDER_*`` variables (``settings.environment_problem``: what is wrong, or ``None``)."""
    if problem is None:
        return Check("environment", True, "no KEYORDER_* variable that catch-up cannot honour")
    return Check("environment", False, problem[1])


def exit_status(checks: Sequence[Check]) -> int:
    """0 when every check passed, else ``EXIT_CONFIG`` (2): refused before touching the group, as the driver's
    own refusals (the operator reads a probe's exit and the catch-up Job's ``podFailurePolicy`` by it)."""
    return 0 if all(check.ok for check in checks) else EXIT_CONFIG


# -- the I/O -------------------------------------------------------------------------------------------------
def run_java(environ: Mapping[str, str]) -> JavaRun:
    command = java_executable(environ)
    try:
        done = subprocess.run(
            [command, "-version"], capture_output=True, text=True, timeout=JAVA_SECONDS, check=False, env=dict(environ)
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return JavaRun(command, error=f"{type(error).__name__}: {error}")
    return JavaRun(command, done.returncode, done.stderr + done.stdout)  # -version writes to stderr


def import_packages(names: Sequence[str] = DRIVER_PACKAGES) -> tuple[dict[str, str | None], dict[str, str]]:
    found: dict[str, str | None] = {}
    errors: dict[str, str] = {}
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception as error:  # an ImportError, or a broken install failing inside its import
            errors[name] = f"{type(error).__name__}: {error}"
        else:
            found[name] = getattr(module, "__version__", None)
    return found, errors


def load(path: str | None, setup: str | None = None, teardown: str | None = None) -> str | None:
    """Load the handler and its hooks as a Spark task would (``keyorder.adapters.handlers.load_for_catchup``);
    why it failed."""
    if not path:
        return None
    from keyorder.adapters.handlers import HandlerLoadError, load_for_catchup

    try:
        load_for_catchup(path, setup, teardown)
    except HandlerLoadError as error:
        return str(error)
    return None


def preflight(handler: str | None, environ: Mapping[str, str]) -> list[Check]:
    from keyorder.catchup.settings import environment_problem
    from keyorder.config import env_name

    found, errors = import_packages()
    hooks = (environ.get(env_name("handler_setup")), environ.get(env_name("handler_teardown")))
    return [
        java_check(run_java(environ)),
        packages_check(found, errors),
        handler_check(handler, load(handler, *hooks)),
        environment_check(environment_problem(environ)),
    ]

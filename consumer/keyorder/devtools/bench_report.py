"""Pure arithmetic and rendering for ``keyorder bench``: ideals, ratios, percentiles, the order of
a run's passes and their best, the targets' comparisons, tables (the plots are ``bench_plots``).

Kept apart from the runner (which owns brokers, pods and clocks) so the numbers a user reads can
be unit-tested, and re-rendered from a saved JSON report without re-running anything.

Why one room of over 600 lines (a few over): it is pure, and each figure and table is read from the
same report's shape, so one module holds that shape; the scenario tables (few keys, resize, hot key)
are the seam if it grows further. The plots left for ``bench_plots``, which alone needs matplotlib.

"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

from keyorder.devtools.bench_handlers import SINK_CALL_SECONDS, SINK_MESSAGE_SECONDS
from keyorder.engine.worker_pools import LATENCY_BUCKETS


@dataclass
class RunResult:
    """The measured outcome of one benchmark run."""

    name: str
    mode: str  # "partition" (baseline), "key", "unordered"
    handler: str  # "sleep", "async-sleep", "noop", "pure", "recording-lock", "fast", "cpu", "sink", ...
    workers: int
    messages: int
    seconds: float
    rate: float
    """Messages per second between the first and the last handled message (of several passes: the
    best pass's; the other figures are that pass's too, but ``order_violations``)."""
    cpu_us_per_message: float
    p50_ms: float | None
    p99_ms: float | None
    peak_rss_mb: float
    peak_inflight: int
    order_violations: int
    """Per-key sequence gaps seen by the handler (expected, and not a failure, in unordered mode); of
    several passes, summed over all of them."""
    ideal_rate: float | None = None
    ratio_to_baseline: float | None = None
    ratio_to_ideal: float | None = None
    executor: str = "auto"
    """``--executor`` of the run's pod (``auto``: thread or async, by the handler)."""
    batch: int = 1
    """``--batch-max-messages`` of the run's pod (1: the handler is called once per message)."""
    mean_batch: float | None = None
    """Messages per batch handler call over the pod's life (``None``: a per-message handler)."""
    batch_reasons: dict[str, int] = field(default_factory=dict)
    """Batch calls by why each was sent (``keyorder.batch.BATCH_REASONS``: full, waited, nothing more ready)."""
    pass_rates: list[float] = field(default_factory=list)
    """Each measured pass's msg/s, in the order they ran (empty: one pass, or a report from before passes)."""


def best_of_passes(passes: Sequence[RunResult]) -> RunResult:
    """One row from its passes: the best by rate, with every pass's rate (``pass_rates``) and the order
    violations of all of them; one pass is returned as it is."""
    if not passes:
        raise ValueError("best_of_passes needs at least one pass")
    if len(passes) == 1:
        return passes[0]
    best = max(passes, key=lambda result: result.rate)
    return replace(
        best,
        order_violations=sum(result.order_violations for result in passes),
        pass_rates=[round(result.rate, 1) for result in passes],
    )


def median_rate(rate: float, pass_rates: Sequence[float]) -> float:
    """The median of a row's passes (its ``rate`` when it ran once)."""
    figures = spread(pass_rates)
    return rate if figures is None else figures[1]


@dataclass(frozen=True)
class Comparison:
    """A target that puts a row of one run against another: ``row`` must reach ``factor`` x ``against``,
    best over best, with the median pass over the median pass beside it (a ratio that holds only for the
    best passes is luck). The pass rates are what each side's best was chosen from."""

    row: str
    row_rate: float
    row_passes: Sequence[float]
    against: str
    against_rate: float
    against_passes: Sequence[float]
    factor: float

    @property
    def ratio(self) -> float:
        return self.row_rate / self.against_rate if self.against_rate else float("inf")

    @property
    def met(self) -> bool:
        return self.ratio >= self.factor

    @property
    def median_ratio(self) -> float | None:
        """``None`` when neither side ran several passes, or the one against ran at 0."""
        if len(self.row_passes) < 2 and len(self.against_passes) < 2:
            return None
        below = median_rate(self.against_rate, self.against_passes)
        return median_rate(self.row_rate, self.row_passes) / below if below else None


@dataclass(frozen=True)
class Pass:
    """One measurement of a row: pass ``number`` of ``passes`` (0: a warm-up pass, discarded)."""

    name: str
    number: int
    passes: int

    @property
    def text(self) -> str:
        return "warm-up pass" if self.number == 0 else f"pass {self.number}/{self.passes}"

    @property
    def last(self) -> bool:
        return self.number == self.passes


def interleave(
    rows: Sequence[tuple[str, int]], groups: Sequence[Sequence[str]], warmups: Collection[str] = ()
) -> list[Pass]:
    """The order to measure ``rows`` ((name, passes), in the order they are defined) in.

    A row runs all its passes in turn, except the rows of a group, which are compared with each
    other: they take turns, pass 1 of each, then pass 2 of each, and so on, so that the machine's
    drift over minutes (1.5-2 x on a shared 2-core VM) hits every row of the group alike. A group
    runs where its first row is defined; a row named in ``warmups`` runs a warm-up pass (number 0)
    before its group's first passes. Names of a group that are not rows are ignored."""
    names = {name for name, _passes in rows}
    passes_of = dict(rows)
    group_of: dict[str, list[str]] = {}
    for group in groups:
        members = [name for name in group if name in names]
        for name in members:
            if name in group_of:
                raise ValueError(f"the bench row {name!r} is in two interleaved groups")
            group_of[name] = members
    order: list[Pass] = []
    done: set[str] = set()
    for name, _passes in rows:
        if name in done:
            continue
        members = group_of.get(name, [name])
        done.update(members)
        order += [Pass(member, 0, passes_of[member]) for member in members if member in warmups]
        for number in range(1, max(passes_of[member] for member in members) + 1):
            order += [Pass(member, number, passes_of[member]) for member in members if number <= passes_of[member]]
    return order


@dataclass
class FewKeysResult:
    """Fewer active keys than a wide pool could use: does throughput reach min(W, keys) / L?"""

    keys: int
    run: RunResult
    """The run, with ``ideal_rate`` and ``ratio_to_ideal`` taken against ``keys``, not the preset's."""


@dataclass
class ResizeResult:
    """A live resize under a backlog: how quickly the new workers turn into throughput."""

    keys: int
    workers_before: int
    workers_after: int
    rate_before: float
    ideal_before: float | None
    seconds_to_target: float | None
    """Seconds from the resize until a trailing window reached the target share of the new ideal
    (``None``: not within the measurement)."""
    target_fraction: float
    rate_after: float | None
    """Mean rate from ``settle_seconds`` after the resize to the end (``None``: too short to say)."""
    ideal_after: float | None
    settle_seconds: float
    window_seconds: float
    backlog_exhausted: bool
    """The measurement ended because the backlog ran low: ``rate_after`` then understates."""
    order_violations: int
    series_seconds: list[float] = field(default_factory=list)
    """Sample times, seconds relative to the resize."""
    series_rates: list[float] = field(default_factory=list)
    """Throughput over the trailing ``window_seconds`` at each sample time."""


LOOK_AHEAD_NOTE = (
    "bounded by the partition's look-ahead window: raise --max-inflight / --max-inflight-per-partition "
    "to look further ahead"
)
"""Why the keys behind the hot key in its partition finish late (no target: the bound is by design)."""


@dataclass
class HotKeyResult:
    """One key carries a large share: do the other keys still finish as if it were not there?

    The others come in two groups. Keys on the other partitions are the target: they should
    finish as if W - 1 workers were theirs alone. Keys sharing the hot key's partition sit behind
    it in the log; once the partition's in-flight bound is full of hot-key messages (which drain
    one per L) the partition is paused, so they are fetched only as fast as the hot key frees
    slots. That is the bounded-memory look-ahead, reported with the bound that applied."""

    workers: int
    hot_share: float
    hot_messages: int
    hot_handled: int
    """Hot-key messages handled by the time the others finished (or the timeout)."""
    other_keys: int
    other_messages: int
    others_seconds: float | None
    """All others: from the first handler call to the last non-hot message finished (``None``: timed out)."""
    others_ideal_seconds: float | None
    """other messages x L / (W - 1): one worker is the hot key's, the rest share the others."""
    ratio_to_ideal: float | None
    timeout_seconds: float
    order_violations: int
    hot_partition: int | None = None
    """The hot key's partition (``None``: not seen, or a report from before the split)."""
    partition_inflight_bound: int | None = None
    """The pod's per-partition in-flight bound: min(max_inflight_per_partition, max_inflight // partitions)."""
    other_partitions_keys: int = 0
    """Other keys on the other partitions (keys handled at least once: all of them unless timed out)."""
    other_partitions_messages: int = 0
    other_partitions_seconds: float | None = None
    """From the first handler call to the last of their messages finished (``None``: not all done)."""
    other_partitions_ideal_seconds: float | None = None
    """Their messages x L / (W - 1)."""
    other_partitions_ratio_to_ideal: float | None = None
    hot_partition_keys: int = 0
    """Other keys sharing the hot key's partition (handled at least once, as above)."""
    hot_partition_messages: int = 0
    """Their messages (the hot key's own not counted)."""
    hot_partition_seconds: float | None = None
    """From the first handler call to the last of their messages finished (``None``: not all done)."""


@dataclass(frozen=True)
class KeyGroup:
    """Some of the hot-key scenario's other keys, and when the last of their messages finished."""

    keys: int
    messages: int
    seconds: float | None
    """From ``started`` (``None``: not all of their messages finished, or no keys at all)."""


def split_by_hot_partition(
    hot: bytes,
    expected: Mapping[bytes, int],
    partitions: Mapping[bytes, int],
    finished: Mapping[bytes, float],
    end_offsets: Mapping[int, int],
    started: float,
) -> tuple[int | None, KeyGroup, KeyGroup] | None:
    """The hot key's partition, then the other keys on the other partitions and those on the hot one.

    ``expected``: messages per key; ``partitions``: the partition each key was handled on (keys not
    yet handled are absent); ``finished``: when each key's last message finished; ``end_offsets``:
    messages per partition as produced (a fresh topic: end offset = count). A group is done once
    its finished keys account for all of its messages; its time is its last key's finish time.
    ``None`` when the hot key was never handled (its partition is unknown)."""
    hot_partition = partitions.get(hot)
    if hot_partition is None:
        return None
    # Messages per group from the produced end offsets, so keys not handled yet still count; if the
    # offsets do not add up (not a fresh topic), only the keys seen, and done only when all were seen.
    exact = sum(end_offsets.values()) == sum(expected.values())
    every_key_seen = all(key in partitions for key in expected)
    groups = []
    for on_hot in (False, True):
        keys = [key for key, partition in partitions.items() if key != hot and (partition == hot_partition) == on_hot]
        if exact:
            messages = sum(count for partition, count in end_offsets.items() if (partition == hot_partition) == on_hot)
            messages -= expected.get(hot, 0) if on_hot else 0
        else:
            messages = sum(expected.get(key, 0) for key in keys)
        done = [key for key in keys if key in finished]
        complete = bool(keys) and sum(expected.get(key, 0) for key in done) == messages and (exact or every_key_seen)
        seconds = max(finished[key] for key in done) - started if complete else None
        groups.append(KeyGroup(keys=len(keys), messages=messages, seconds=seconds))
    return hot_partition, groups[0], groups[1]


@dataclass
class RawCeilingResult:
    """A plain confluent-kafka consume loop (json.loads per message, no keyorder) on the same data.

    Measured warm: a first pass over the topic is discarded (``warmup_rate``), then the best of
    ``pass_rates`` (each a fresh group over the same messages) is the ceiling; ``messages``,
    ``seconds`` and ``rate`` are that pass's. One short pass reads bursts (issue 40: 318,000 msg/s at
    100,000 messages where 500,000 read 145,000 three times), so the spread is reported beside it."""

    messages: int
    seconds: float
    rate: float
    order_violations: int
    """Over every pass, the warm-up's included."""
    compared_run: str | None = None
    """The keyorder run put against this ceiling (the no-op run)."""
    compared_fraction: float | None = None
    """That run's rate as a fraction of this one's."""
    pass_rates: list[float] = field(default_factory=list)
    """Each measured pass's msg/s, in the order they ran (empty: a report from before the passes)."""
    warmup_rate: float | None = None
    """The discarded first pass's msg/s (``None``: no warm-up pass)."""


def spread(rates: Sequence[float]) -> tuple[float, float, float] | None:
    """(min, median, max) of ``rates`` (``None`` for none); the median of an even count is the mean of
    the middle two."""
    if not rates:
        return None
    ordered = sorted(rates)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return ordered[0], median, ordered[-1]


def raw_ceiling_of(
    passes: Sequence[tuple[int, float, float, int]], warmup: tuple[int, float, float, int] | None
) -> RawCeilingResult:
    """The ceiling from the raw loop's measured passes and its warm-up pass (``None``: none ran), each
    (messages, seconds, msg/s, order violations): the best pass, the others its spread."""
    if not passes:
        raise ValueError("the raw ceiling needs at least one measured pass")
    best = max(passes, key=lambda figures: figures[2])
    return RawCeilingResult(
        messages=best[0],
        seconds=round(best[1], 3),
        rate=best[2],
        order_violations=sum(figures[3] for figures in passes) + (warmup[3] if warmup else 0),
        pass_rates=[round(figures[2], 1) for figures in passes],
        warmup_rate=round(warmup[2], 1) if warmup else None,
    )


def spread_suffix(pass_rates: Sequence[float]) -> str:
    """ ", best of N (min, median, max)" after a rate measured N > 1 times; nothing after one pass."""
    figures = spread(pass_rates)
    if figures is None or len(pass_rates) < 2:
        return ""
    low, median, high = figures
    return f", best of {len(pass_rates)} (min {low:,.0f}, median {median:,.0f}, max {high:,.0f})"


def raw_ceiling_summary(raw: RawCeilingResult) -> str:
    """The ceiling and its spread, as the console and the table show it."""
    text = f"{raw.rate:,.0f} msg/s{spread_suffix(raw.pass_rates)}"
    if raw.warmup_rate is not None:
        text += f"; warm-up pass {raw.warmup_rate:,.0f} discarded"
    return text


@dataclass
class Scenarios:
    """Shapes of traffic the uniform many-key runs do not cover; each measured in the same invocation."""

    few_keys: FewKeysResult | None = None
    resize: ResizeResult | None = None
    hot_key: HotKeyResult | None = None
    raw_ceiling: RawCeilingResult | None = None

    @property
    def order_violations(self) -> int:
        found = (self.few_keys.run if self.few_keys else None, self.resize, self.hot_key, self.raw_ceiling)
        return sum(result.order_violations for result in found if result is not None)

    @classmethod
    def from_dict(cls, data: dict) -> Scenarios:
        few_keys = data.get("few_keys")
        resize, hot_key, raw = data.get("resize"), data.get("hot_key"), data.get("raw_ceiling")
        return cls(
            few_keys=FewKeysResult(keys=few_keys["keys"], run=RunResult(**few_keys["run"])) if few_keys else None,
            resize=ResizeResult(**resize) if resize else None,
            hot_key=HotKeyResult(**hot_key) if hot_key else None,
            raw_ceiling=RawCeilingResult(**raw) if raw else None,
        )


@dataclass
class BenchReport:
    machine: dict
    parameters: dict
    runs: list[RunResult] = field(default_factory=list)
    commit_metadata_bytes: int | None = None
    targets: dict = field(default_factory=dict)
    scenarios: Scenarios = field(default_factory=Scenarios)
    process_hop: dict | None = None
    """The process executor's per-message costs (``bench.process_hop_figures``), in microseconds."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> BenchReport:
        data = json.loads(text)
        runs = [RunResult(**run) for run in data.pop("runs")]
        scenarios = Scenarios.from_dict(data.pop("scenarios", None) or {})  # reports from before scenarios
        return cls(runs=runs, scenarios=scenarios, **data)


def ideal_rate(workers: int, active_keys: int, latency: float) -> float | None:
    """The physical ceiling for an IO-bound handler: min(W, active keys) / L (None for L = 0)."""
    if latency <= 0:
        return None
    return min(workers, active_keys) / latency


def histogram_percentile(buckets: Sequence[int], quantile: float) -> float | None:
    """Percentile (seconds) from non-cumulative bucket counts over ``LATENCY_BUCKETS`` (+Inf last),
    interpolated linearly inside the bucket, as Prometheus' ``histogram_quantile`` does."""
    total = sum(buckets)
    if not total:
        return None
    rank = quantile * total
    seen = 0
    lower = 0.0
    for index, count in enumerate(buckets):
        upper = LATENCY_BUCKETS[index] if index < len(LATENCY_BUCKETS) else LATENCY_BUCKETS[-1]
        if count and seen + count >= rank:
            return lower + (upper - lower) * (rank - seen) / count
        seen += count
        lower = upper
    return LATENCY_BUCKETS[-1]


def sink_ideal_rate(workers: int, batch: int, active_keys: int) -> float:
    """The ceiling the sink's own cost sets (``bench_handlers.sink_call``): W calls at a time, each of
    up to ``batch`` messages of distinct keys, so min(W x batch, keys) messages per call time."""
    call = SINK_CALL_SECONDS + batch * SINK_MESSAGE_SECONDS
    return min(workers * batch, active_keys) / call


FAST_HANDLER_LATENCY = 0.0003
"""Seconds the ``fast`` handler sleeps: a handler of a few hundred microseconds that waits on IO (a
cache write, a produce), where the pod's own per-message cost decides the throughput."""


def fill_ratios(runs: list[RunResult], active_keys: int, latency: float) -> None:
    """Ratio of every run to the baseline with the same handler family, and to its ideal."""
    baselines = {run.handler.replace("async-", ""): run for run in runs if run.mode == "partition"}
    latencies = {"sleep": latency, "async-sleep": latency, "fast": FAST_HANDLER_LATENCY}
    for run in runs:
        if run.handler in ("sink", "sink_batch"):
            run.ideal_rate = sink_ideal_rate(run.workers, run.batch, active_keys)
            run.ratio_to_ideal = run.rate / run.ideal_rate
        elif run.handler in latencies:
            run.ideal_rate = ideal_rate(run.workers, active_keys, latencies[run.handler])
            if run.ideal_rate:
                run.ratio_to_ideal = run.rate / run.ideal_rate
        baseline = baselines.get(run.handler.replace("async-", ""))
        if baseline is not None and baseline.rate > 0:
            run.ratio_to_baseline = run.rate / baseline.rate


def regressions(
    runs: Sequence[RunResult], baseline: Sequence[RunResult], floor: float
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """Rows measured in both reports (same name, messages handled in both), each as (name, rate over
    the baseline's), lowest first; then those of them under ``floor``."""
    before = {run.name: run for run in baseline if run.messages and run.rate}
    ratios = sorted(
        ((run.name, run.rate / before[run.name].rate) for run in runs if run.messages and run.name in before),
        key=lambda pair: pair[1],
    )
    return ratios, [(name, ratio) for name, ratio in ratios if ratio < floor]


def trailing_rates(times: Sequence[float], counts: Sequence[int], window: float) -> list[tuple[float, float]]:
    """(time, msg/s over the trailing ``window``) at every sample that has a full window behind it.

    ``counts`` are cumulative handled counts sampled at ``times`` (ascending)."""
    rates = []
    start = 0
    slack = 1e-9  # so that sample times 0.1 apart make whole windows despite float rounding
    for index, now in enumerate(times):
        if now - times[0] < window - slack:
            continue
        while times[start + 1] <= now - window + slack:
            start += 1
        rates.append((now, (counts[index] - counts[start]) / (now - times[start])))
    return rates


def resize_figures(
    times: Sequence[float],
    counts: Sequence[int],
    resize_at: float,
    threshold: float,
    window: float,
    settle: float,
) -> tuple[float, float | None, float | None, list[tuple[float, float]]]:
    """Rate before the resize, seconds until a trailing window reached ``threshold`` msg/s, rate
    from ``settle`` seconds after the resize to the end, and the windowed series (times relative to
    the resize). Samples start at the first handled message; the last one before ``resize_at``
    closes the before-window."""
    before = max(index for index, now in enumerate(times) if now <= resize_at)
    rate_before = (counts[before] - counts[0]) / (times[before] - times[0]) if before else 0.0
    series = [(now - resize_at, rate) for now, rate in trailing_rates(times, counts, window)]
    reached = next((now for now, rate in series if now > 0 and rate >= threshold), None)
    settled = next((index for index, now in enumerate(times) if now >= resize_at + settle), None)
    rate_after = None
    if settled is not None and times[-1] > times[settled]:
        rate_after = (counts[-1] - counts[settled]) / (times[-1] - times[settled])
    return rate_before, reached, rate_after, series


def markdown_table(runs: Sequence[RunResult]) -> str:
    """One row per run; a row measured in several passes shows its best, then their spread, in msg/s."""
    rows = [
        "| run | handler | W | msg/s | x baseline | x ideal | p50 ms | p99 ms | CPU µs/msg | peak RSS MB "
        "| order violations | mean batch |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def number(value: float | None, digits: int = 1) -> str:
        return "-" if value is None else f"{value:,.{digits}f}"

    for run in runs:
        rows.append(
            f"| {run.name} | {run.handler} | {run.workers} | {run.rate:,.0f}{spread_suffix(run.pass_rates)} | "
            f"{number(run.ratio_to_baseline)} | {number(run.ratio_to_ideal, 2)} | {number(run.p50_ms)} | "
            f"{number(run.p99_ms)} | {run.cpu_us_per_message:.1f} | {run.peak_rss_mb:.0f} | "
            f"{run.order_violations} | {number(run.mean_batch)} |"
        )
    return "\n".join(rows) + "\n"


def scenarios_table(scenarios: Scenarios) -> str:
    """One row per scenario that ran: what was measured, against what ideal, and the target."""
    rows = [
        "| scenario | W | measured | ideal | ratio | target | order violations |",
        "|---|---|---|---|---|---|---:|",
    ]

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f} msg/s"

    def times(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f} x"

    few = scenarios.few_keys
    if few is not None:
        run = few.run
        rows.append(
            f"| few keys: {few.keys:,} keys | {run.workers} | {rate(run.rate)} | {rate(run.ideal_rate)} "
            f"| {times(run.ratio_to_ideal)} ideal | >= 0.85 x ideal | {run.order_violations} |"
        )
    resize = scenarios.resize
    if resize is not None:
        reached = "never" if resize.seconds_to_target is None else f"after {resize.seconds_to_target:.1f} s"
        after_ratio = (
            resize.rate_after / resize.ideal_after if resize.rate_after is not None and resize.ideal_after else None
        )
        before_ratio = resize.rate_before / resize.ideal_before if resize.ideal_before else None
        rows.append(
            f"| live resize under backlog: {resize.keys:,} keys | {resize.workers_before} -> {resize.workers_after} "
            f"| before {rate(resize.rate_before)}; {resize.target_fraction:g} x new ideal {reached}; "
            f"after {rate(resize.rate_after)}{' (backlog ran low)' if resize.backlog_exhausted else ''} "
            f"| {rate(resize.ideal_before)} -> {rate(resize.ideal_after)} "
            f"| before {times(before_ratio)}, after {times(after_ratio)} ideal "
            f"| {resize.target_fraction:g} x new ideal within 3 s | {resize.order_violations} |"
        )
    hot = scenarios.hot_key
    if hot is not None:
        rows.extend(hot_key_rows(hot))
    raw = scenarios.raw_ceiling
    if raw is not None:
        compared = "-" if raw.compared_fraction is None else f"{raw.compared_run}: {raw.compared_fraction:.2f} x raw"
        rows.append(
            f"| raw ceiling: plain confluent-kafka loop | - | {raw_ceiling_summary(raw)} | - | {compared} "
            f"| >= 0.3 x raw | {raw.order_violations} |"
        )
    return "\n".join(rows) + "\n"


def hot_key_rows(hot: HotKeyResult) -> list[str]:
    """The hot-key scenario's rows: all others (one run, so its violations), then the two groups."""

    def done(seconds: float | None) -> str:
        return f"done in {seconds:.2f} s" if seconds is not None else f"not done within {hot.timeout_seconds:g} s"

    def ideal(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds:.2f} s"

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} x ideal"

    split = hot.hot_partition is not None
    rows = [
        f"| hot key: {hot.hot_share:.0%} on one key, all {hot.other_keys:,} others | {hot.workers} "
        f"| {done(hot.others_seconds)} ({hot.other_messages:,} messages; "
        f"hot key {hot.hot_handled:,}/{hot.hot_messages:,} by then) "
        f"| {ideal(hot.others_ideal_seconds)} | {ratio(hot.ratio_to_ideal)} "
        f"| {'- (by partition below)' if split else '<= 1.5 x ideal'} | {hot.order_violations} |"
    ]
    if split:
        bound = "-" if hot.partition_inflight_bound is None else f"{hot.partition_inflight_bound:,}"
        rows.append(
            f"| hot key: others on other partitions, {hot.other_partitions_keys:,} keys | {hot.workers} "
            f"| {done(hot.other_partitions_seconds)} ({hot.other_partitions_messages:,} messages) "
            f"| {ideal(hot.other_partitions_ideal_seconds)} | {ratio(hot.other_partitions_ratio_to_ideal)} "
            f"| <= 1.5 x ideal | (same run) |"
        )
        rows.append(
            f"| hot key: others on the hot key's partition {hot.hot_partition}, {hot.hot_partition_keys:,} keys "
            f"| {hot.workers} | {done(hot.hot_partition_seconds)} ({hot.hot_partition_messages:,} messages, "
            f"interleaved with the hot key's {hot.hot_messages:,}) | - (look-ahead: {bound} in flight per partition) "
            f"| - "
            f"| none: {LOOK_AHEAD_NOTE} | (same run) |"
        )
    return rows

"""The config in force: one immutable snapshot of policy and quotas, swapped whole on reload.

Both sources (files when standalone, ConfigMaps in a cluster) hand what they read to
`ConfigHolder.offer` or `ConfigHolder.reject`, so a reload is logged, counted and exported
the same way whatever it came from. The `config` label of the metrics names the part by
its ConfigMap, `gpuadm-policy` or `gpuadm-quotas`, for files too.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from policies import (
    ConfigError,
    Plan,
    Policy,
    QuotaConfig,
    load_policy,
    load_quotas,
    policy_warnings,
)
from policies.pods.pod_view import PodView
from webhook.config.plan_memo import PlanMemo
from webhook.config.read_budget import READ_BUDGET_SECONDS, ReadOverran, read_within
from webhook.observe.readings import MemoReading

if TYPE_CHECKING:
    from webhook.observe.metrics import Metrics

log = logging.getLogger("gpuadm.config")

# A config that stays invalid is logged again this often, so that it is not forgotten.
RELOG_SECONDS = 60.0
POLICY_PART = "gpuadm-policy"
QUOTAS_PART = "gpuadm-quotas"
PARTS = (POLICY_PART, QUOTAS_PART)


class Revisions(NamedTuple):
    """Content digests of the policy and quotas that judged, as audit records name them."""

    policy: str
    quotas: str


@dataclass(frozen=True, slots=True)
class ConfigSnapshot:
    """A policy and quota config that were valid together, with the revision of each."""

    policy: Policy
    quotas: QuotaConfig
    policy_revision: str
    quotas_revision: str
    # Why no valid quota config has ever been read (in a cluster, before an admin fixes
    # gpuadm-quotas): `quotas` is then empty, and governed GPU pods are refused, not let
    # through unlimited. None when `quotas` is a real config.
    quotas_missing: str | None = None
    plans: PlanMemo = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "plans", PlanMemo(self.policy))

    @property
    def revisions(self) -> Revisions:
        """Return the revisions of both parts."""
        return Revisions(self.policy_revision, self.quotas_revision)

    def plan(self, pod: Mapping[str, Any], namespace: str, view: PodView | None = None) -> Plan:
        """Return the plan of a pod in a namespace under this config, or raise `Denial`.

        `view` is the pod's view, when the caller has made one already.
        """
        default_class = self.quotas.default_class_for(namespace)
        return self.plans.plan(
            pod, namespace=namespace, namespace_default_class=default_class, view=view
        )


def revision_of(text: str) -> str:
    """Return a short content digest, so audit records can name the config that judged."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# The revision of "no quota config given": a command run with no --quotas file.
NO_QUOTAS_REVISION = "none"
# The revision of quotas while none valid was ever read (the snapshot's `quotas_missing`).
MISSING_QUOTAS_REVISION = "missing"


def snapshot_from_text(
    policy_text: str,
    quotas_text: str | None,
    *,
    policy_source: str,
    quotas_source: str,
    policy_first_line: int = 1,
    quotas_first_line: int = 1,
) -> ConfigSnapshot:
    """Parse both configs; raise `policies.ConfigError` naming the file and line when invalid.

    `quotas_text` None means no quota config was given at all (a command run without
    `--quotas`): no limits. Empty text is an invalid config, never that. A text that is a
    block of a larger file starts at its `..._first_line` of it.
    """
    policy = load_policy(policy_text, source=policy_source, first_line=policy_first_line)
    if quotas_text is None:
        return ConfigSnapshot(policy, QuotaConfig(), revision_of(policy_text), NO_QUOTAS_REVISION)
    quotas = load_quotas(quotas_text, source=quotas_source, first_line=quotas_first_line)
    return ConfigSnapshot(policy, quotas, revision_of(policy_text), revision_of(quotas_text))


@dataclass(frozen=True, slots=True)
class Missing:
    """A config part that could not be read at all: no ConfigMap, no key, no file."""

    reason: str


@dataclass(frozen=True, slots=True)
class PartText:
    """What a source read for one part: its text, or why there is none; and where from.

    `read` None is for quotas only: none were given (a command run without `--quotas`).
    """

    read: str | Missing | None
    source: str


NO_QUOTAS = PartText(None, "(no quota config given)")


_LOADERS: dict[str, Callable[..., Any]] = {POLICY_PART: load_policy, QUOTAS_PART: load_quotas}
# A text left unread for lack of time is tried again this long after, not at every poll:
# each try holds a thread and a core for the whole budget.
RETRY_OVERRUN_SECONDS = 60.0
_NEVER = float("inf")


def _read_all(texts: Mapping[str, PartText]) -> dict[str, Any]:
    """Read each part's text: its model, or the `ConfigError` that says why not."""
    read: dict[str, Any] = {}
    for part, text in texts.items():
        try:
            read[part] = _LOADERS[part](text.read, source=text.source)
        except ConfigError as error:
            read[part] = error
    return read


class _Good(NamedTuple):
    """The last valid version of a part: its model and revision."""

    model: Any
    revision: str


class NoConfig(Exception):
    """No valid config has been loaded yet (in a cluster: the ConfigMaps are missing or bad)."""


class ConfigHolder:
    """Holds the snapshot in force; readers take `current` once per request.

    Each part (policy, quotas) keeps its last valid version on its own: an invalid edit of
    one never takes the other's edit back, and a part that cannot be read (its ConfigMap or
    key gone, its file empty or half-written) is an invalid edit like any other.
    """

    def __init__(
        self,
        snapshot: ConfigSnapshot | None = None,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        read_seconds: float = READ_BUDGET_SECONDS,
    ) -> None:
        """Start with `snapshot` in force (or none); report reloads to `metrics`. `reload`
        gives each read `read_seconds`."""
        self._clock = clock
        self._logged_at: dict[str, float] = {}
        self._snapshot: ConfigSnapshot | None = None
        if metrics is None:
            # Here, not at import: a command that reads a snapshot once exports no metrics.
            from webhook.observe.metrics import Metrics

            metrics = Metrics()
        self._metrics = metrics
        # Evictions of the memos of snapshots no longer in force, so the counter only grows.
        self._evictions_before = 0
        self._metrics.watch_plan_memo(self._memo_reading)
        self._listeners: list[Callable[[], None]] = []
        self._good: dict[str, _Good] = {}
        # Why the latest version of a part is not in force, for the parts whose is not.
        self._problems: dict[str, str] = {}
        # The latest version of each part refused, why, and until when: a text refused for
        # what it says is not read again until it changes; one left unread, for a while.
        self._refused: dict[str, tuple[str, str, float]] = {}
        self.read_seconds = read_seconds
        if snapshot is not None:
            self.offer(snapshot)

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener()` after each new snapshot is put in force (a limit may have grown)."""
        self._listeners.append(listener)

    def _memo_reading(self) -> MemoReading:
        snapshot = self._snapshot
        if snapshot is None:
            return MemoReading(0, 0, self._evictions_before)
        stats = snapshot.plans.stats()
        return MemoReading(
            stats.entries, stats.weight_bytes, self._evictions_before + stats.evictions
        )

    @property
    def loaded(self) -> bool:
        """Tell whether a valid config is in force."""
        return self._snapshot is not None

    @property
    def current(self) -> ConfigSnapshot:
        """Return the snapshot in force, or raise `NoConfig`."""
        if self._snapshot is None:
            problem = self._problems.get(POLICY_PART)
            raise NoConfig(
                "gpuadm has not loaded a valid policy yet" + (f": {problem}" if problem else "")
            )
        return self._snapshot

    def problems(self) -> Mapping[str, str]:
        """Return why the latest version of each part is not in force, for those parts."""
        return dict(self._problems)

    def update(self, policy: PartText, quotas: PartText) -> Update:
        """Take what a source read of both parts; put the valid ones in force.

        A part that is invalid or missing is rejected and keeps its last valid version.
        Before any valid quota config, the snapshot says why (`quotas_missing`), so that GPU
        pods are refused rather than admitted without limits. The parts are read here and
        now; a serving replica calls `reload`, which reads within a time budget.
        """
        return self._settle(policy, quotas, {})

    async def reload(self, policy: PartText, quotas: PartText) -> Update:
        """Like `update`, but the new versions are read in a worker, both within one budget
        of `read_seconds`.

        A read past it is refused like an invalid edit, and the last good parts stay in
        force; the event loop, the answers and SIGTERM never wait on the parser. Such a
        text is no verdict: it is read again `RETRY_OVERRUN_SECONDS` later, when a source
        offers it again (`read_pending` says one should).
        """
        texts = {
            part: text
            for part, text in ((POLICY_PART, policy), (QUOTAS_PART, quotas))
            if isinstance(text.read, str) and self._unread(part, text.read)
        }
        read: dict[str, Any] = {}
        if texts:
            source = " and ".join(text.source for text in texts.values())
            try:
                read = await read_within(
                    functools.partial(_read_all, texts), source=source, seconds=self.read_seconds
                )
            except ConfigError as error:  # overran, or not started: no verdict on the texts
                read = dict.fromkeys(texts, error)
        return self._settle(policy, quotas, read)

    @property
    def read_pending(self) -> bool:
        """Tell whether a part's latest text was left unread for lack of time, and should
        be offered again."""
        return any(until != _NEVER for _, _, until in self._refused.values())

    def _settle(self, policy: PartText, quotas: PartText, read: Mapping[str, Any]) -> Update:
        rejected: dict[str, str] = {}
        for part, text in ((POLICY_PART, policy), (QUOTAS_PART, quotas)):
            problem = self._take(part, text, read)
            if problem is not None:
                rejected[part] = problem
        good_policy = self._good.get(POLICY_PART)
        if good_policy is None:
            return Update(applied=False, rejected=rejected)
        good_quotas = self._good.get(QUOTAS_PART)
        snapshot = ConfigSnapshot(
            good_policy.model,
            good_quotas.model if good_quotas is not None else QuotaConfig(),
            good_policy.revision,
            good_quotas.revision if good_quotas is not None else MISSING_QUOTAS_REVISION,
            quotas_missing=None
            if good_quotas is not None
            else self._problems.get(QUOTAS_PART, "no quota config read yet"),
        )
        return Update(applied=self._put_in_force(snapshot), rejected=rejected)

    def _unread(self, part: str, text: str) -> bool:
        """Tell whether `text` is news for `part`: neither its version in force nor one
        refused (a source reads the same text again at every poll and relist), unless it
        was refused for lack of time, long enough ago."""
        revision = revision_of(text)
        good = self._good.get(part)
        return (good is None or good.revision != revision) and self._refusal(part, revision) is None

    def _refusal(self, part: str, revision: str) -> str | None:
        """Return why this version of `part` stands refused, if it still does."""
        refused = self._refused.get(part)
        if refused is None or refused[0] != revision or self._clock() >= refused[2]:
            return None
        return refused[1]

    def _take(self, part: str, text: PartText, read: Mapping[str, Any]) -> str | None:
        """Put one part's new version in force if valid (`read` holds it if read already);
        return why it was rejected, or None."""
        if isinstance(text.read, Missing):
            return self.reject(part, text.read.reason)
        if text.read is None:
            model: Any = QuotaConfig()
            revision = NO_QUOTAS_REVISION
        else:
            revision = revision_of(text.read)
            good = self._good.get(part)
            if good is not None and good.revision == revision:
                self._recovered(part)
                return None
            if (refusal := self._refusal(part, revision)) is not None:
                return self.reject(part, refusal)
            model = read[part] if part in read else _read_all({part: text})[part]
            if isinstance(model, ConfigError):
                reason = "; ".join(model.problems)
                # Overran is no verdict on the text: a calmer moment may read it.
                until = self._clock() + RETRY_OVERRUN_SECONDS
                self._refused[part] = (
                    revision,
                    reason,
                    until if isinstance(model, ReadOverran) else _NEVER,
                )
                return self.reject(part, reason)
        self._good[part] = _Good(model, revision)
        self._recovered(part)
        return None

    def _recovered(self, part: str) -> None:
        refused = self._refused.get(part)
        if refused is not None and refused[2] != _NEVER:
            del self._refused[part]  # a text left unread is no longer pending
        self._metrics.config_valid.labels(part).set(1)
        if self._problems.pop(part, None) is not None:
            log.info("config %s is valid again", part)

    def offer(self, snapshot: ConfigSnapshot) -> bool:
        """Put a valid snapshot, read whole, in force unless it is the one in force; tell
        which it was."""
        if snapshot.quotas_missing is None:
            self._good[QUOTAS_PART] = _Good(snapshot.quotas, snapshot.quotas_revision)
            self._recovered(QUOTAS_PART)
        self._good[POLICY_PART] = _Good(snapshot.policy, snapshot.policy_revision)
        self._recovered(POLICY_PART)
        return self._put_in_force(snapshot)

    def _put_in_force(self, snapshot: ConfigSnapshot) -> bool:
        current = self._snapshot
        if (
            current is not None
            and current.revisions == snapshot.revisions
            and current.quotas_missing == snapshot.quotas_missing
        ):
            return False
        for part, changed in (
            (POLICY_PART, current is None or current.policy_revision != snapshot.policy_revision),
            (QUOTAS_PART, current is None or current.quotas_revision != snapshot.quotas_revision),
        ):
            if changed:
                self._metrics.config_reloads.labels(part, "applied").inc()
        if current is not None:
            self._evictions_before += current.plans.stats().evictions
        self._snapshot = snapshot
        self._metrics.config_in_force(snapshot.policy_revision, snapshot.quotas_revision)
        if current is None or current.policy_revision != snapshot.policy_revision:
            for warning in policy_warnings(snapshot.policy):
                log.warning("%s: %s", POLICY_PART, warning)
        for problem in snapshot.quotas.unknown_classes(snapshot.policy):
            log.warning("%s: %s", QUOTAS_PART, problem)
        if snapshot.quotas_missing is not None:
            log.error(
                "no valid quota config yet, so GPU pods in governed namespaces are refused: %s",
                snapshot.quotas_missing,
            )
        log.info(
            "config in force: policy %s, quotas %s",
            snapshot.policy_revision,
            snapshot.quotas_revision,
        )
        for listener in self._listeners:
            listener()
        return True

    def reject(self, part: str, reason: str) -> str:
        """Record that the latest version of `part` is invalid; the config in force stays.

        Counted once per distinct reason, however often a source reads it again, and logged
        again every `RELOG_SECONDS` while it lasts. Return the reason.
        """
        self._metrics.config_valid.labels(part).set(0)
        now = self._clock()
        if self._problems.get(part) == reason:
            if now - self._logged_at.get(part, now) >= RELOG_SECONDS:
                self._logged_at[part] = now
                log.error("config %s is still invalid: %s", part, reason)
            return reason
        self._problems[part] = reason
        self._logged_at[part] = now
        self._metrics.config_reloads.labels(part, "rejected").inc()
        kept = "the last good one stays in force" if part in self._good else "none is in force"
        log.error("config not reloaded (%s), %s: %s", part, kept, reason)
        return reason


class Update(NamedTuple):
    """What one `ConfigHolder.update` did: whether a new snapshot went in force, and which
    parts were rejected, with why."""

    applied: bool
    rejected: dict[str, str]

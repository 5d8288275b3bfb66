"""The reservation record's text: what a ConfigMap holds, encoded a reservation at a time, in
a format that 0.1.0's replicas fail to read rather than misread."""

from __future__ import annotations

import uuid
from fractions import Fraction
from typing import Any

import orjson
import pytest

from webhook.kube.endpoint import Endpoint
from webhook.kube.errors import KubeError
from webhook.kube.rest import AsyncApi
from webhook.observe.metrics import Metrics
from webhook.quota.configmap_store import (
    ALLOWANCES_KEY,
    DATA_KEY,
    FORMAT,
    FORMAT_KEY,
    MARK_KEY,
    RECORD_MAX_BYTES,
    ConfigMapStore,
    RecordText,
    record_of,
)
from webhook.quota.reservations import (
    Allowance,
    Conflict,
    Mark,
    Record,
    RecordFull,
    Reservation,
    UnreadableRecord,
)


def reservation(at: float, charge: str = "1", pod: str = "p") -> Reservation:
    return Reservation("h100", Fraction(charge), at, pod)


def whole(reservations: dict[str, Reservation]) -> bytes:
    """The record's JSON, encoded at once."""
    return orjson.dumps([{"uid": uid, **r.to_json()} for uid, r in reservations.items()])


def test_each_write_is_the_whole_record_encoded_at_once() -> None:
    text = RecordText()
    record: dict[str, Reservation] = {}
    assert text.encode("team-a", record) == b"[]"
    for step in range(30):
        record[str(uuid.uuid4())] = reservation(1000.0 + step, charge=("1", "0.5", "7/3")[step % 3])
        if step % 4 == 3:  # the oldest expires
            del record[next(iter(record))]
        if step % 5 == 4:  # one is written again with a new time and charge (a release)
            uid = next(iter(record))
            record[uid] = reservation(2000.0 + step, charge="2", pod="again")
        assert text.encode("team-a", dict(record)) == whole(record)


def test_a_reservation_replaced_under_its_uid_is_encoded_anew() -> None:
    text = RecordText()
    first = {"u": reservation(1.0)}
    text.encode("team-a", first)
    # Equal in every field but the time: the text must be the new reservation's.
    second = {"u": reservation(2.0)}
    assert record_of(configmap(text.encode("team-a", second))).reservations == second


def test_namespaces_are_kept_apart_and_forgotten() -> None:
    text = RecordText()
    shared = reservation(1.0)
    assert text.encode("team-a", {"u": shared}) == whole({"u": shared})
    other = {"v": reservation(3.0, charge="0.5")}
    assert text.encode("team-b", other) == whole(other)
    text.forget("team-a")
    assert text.namespaces() == ["team-b"]
    assert text.encode("team-a", {"u": shared}) == whole({"u": shared})
    text.keep_only(["team-b", "team-c"])
    assert text.namespaces() == ["team-b"]


def test_the_text_reads_back_as_the_record_written() -> None:
    text = RecordText()
    record = {
        str(uuid.uuid4()): reservation(1000.5 + n, charge="1/3", pod=f"p-{n}") for n in range(5)
    }
    assert record_of(configmap(text.encode("team-a", record))).reservations == record


def test_a_reservation_marked_stored_reads_back_marked() -> None:
    marked = Reservation("h100", Fraction(1, 2), 5.0, "p", 123456789, "gpuadm.io/class")
    record = {"u": marked, "v": reservation(6.0)}
    text = RecordText().encode("team-a", record)
    assert b'"stored":{"version":"123456789","label":"gpuadm.io/class"}' in text
    assert b"stored" not in whole({"v": reservation(6.0)})  # unmarked: as before the mark
    assert record_of(configmap(text)).reservations == record


@pytest.mark.parametrize(
    "stored",
    [
        pytest.param(None, id="absent"),
        pytest.param("12", id="not-a-mapping"),
        pytest.param({"version": 12, "label": "l"}, id="number"),
        pytest.param({"version": "-12", "label": "l"}, id="negative"),
        pytest.param({"version": "\u00b2", "label": "l"}, id="unicode-digit"),
        pytest.param({"version": "9" * 21, "label": "l"}, id="too-long"),
    ],
)
def test_a_stored_mark_that_cannot_be_read_reads_as_not_known(stored: Any) -> None:
    """A record written by an older replica, or edited by hand: the reservation counts
    until it expires, as it did before marks."""
    entry: dict[str, Any] = {"class": "h100", "charge": "1", "at": 5.0, "pod": "p"}
    if stored is not None:
        entry["stored"] = stored
    read = Reservation.from_json(orjson.loads(orjson.dumps(entry)))
    assert (read.stored, read.stored_by) == (0, "")
    assert read == reservation(5.0)


async def test_a_record_larger_than_a_configmap_holds_is_refused_before_it_is_sent() -> None:
    # Nothing listens on this address: a record that passes the size check reaches the
    # network and fails there with a connection error; one that does not raises RecordFull.
    api = AsyncApi(Endpoint("https://127.0.0.1:9", None, None, None, False, lambda: None))
    store = ConfigMapStore(api=api, namespace="gpuadm-system")
    # Pod names may be 253 characters long: a reservation then takes about 350 bytes.
    record = {str(uuid.uuid4()): reservation(1e9 + n, pod="p" * 253) for n in range(2900)}
    # One more reservation whose pod name makes the text exactly as long as the limit.
    last = str(uuid.uuid4())
    short = len(whole({**record, last: reservation(2e9, pod="")}))
    record[last] = reservation(2e9, pod="q" * (RECORD_MAX_BYTES - short))
    assert len(whole(record)) == RECORD_MAX_BYTES
    try:
        with pytest.raises(KubeError) as sent:
            await store.write("team-a", record, "41")
        assert not isinstance(sent.value, RecordFull)
        assert sent.value.status == 0  # no answer: it was sent
        record[last] = reservation(2e9, pod="q" * (RECORD_MAX_BYTES - short + 1))
        with pytest.raises(RecordFull) as refused:
            await store.write("team-a", record, "41")
        assert refused.value.status == 413
        assert refused.value.detail.startswith(
            'the quota record of namespace "team-a" is full: 2901 reservations'
        )
    finally:
        await api.close()


def configmap(text: bytes) -> dict[str, object]:
    return {"data": {DATA_KEY: text.decode()}, "metadata": {"resourceVersion": "1"}}


class SentBodies(AsyncApi):
    """An apiserver that keeps the bytes of every ConfigMap body sent to it, as the real
    client encodes them, and refuses the replaces it is told to (409: the record moved on)."""

    def __init__(self) -> None:
        super().__init__(Endpoint("https://127.0.0.1:9", None, None, None, False, lambda: None))
        self.sent: list[bytes] = []
        self.conflicts = 0

    async def create_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.sent.append(orjson.dumps(body))
        return {"metadata": {"resourceVersion": "1"}}

    async def replace_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.sent.append(orjson.dumps(body))
        if self.conflicts:
            self.conflicts -= 1
            raise KubeError(409, "the object has been modified")
        return {"metadata": {"resourceVersion": str(len(self.sent))}}


def bytes_written(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value("gpuadm_quota_record_bytes_written_total")
    assert value is not None
    return value


async def test_the_bytes_written_are_those_of_every_body_sent_lost_races_included() -> None:
    api, metrics = SentBodies(), Metrics()
    store = ConfigMapStore(api=api, namespace="gpuadm-system", metrics=metrics)
    # Names that the record's JSON escapes once more inside the body's string: quotes and
    # backslashes (a key is any text), control characters (escaped in the record already),
    # and UTF-8 written as it is.
    names = ['p"q', "back\\slash", "tab\there", "nl\n", "\x00\x1f", "ünïcode-名前", "\u2028", ""]
    record: dict[str, Reservation] = {}
    version = await store.write("team-a", record, None)
    for n, name in enumerate(names):
        record[f'uid-"{n}"\\'] = reservation(
            1e9 + n / 3, charge=("1", "1/7", "2.5")[n % 3], pod=name
        )
        api.conflicts = n % 2  # every other write loses its race once, then is sent again
        try:
            version = await store.write("team-a", dict(record), version)
        except Conflict:
            version = await store.write("team-a", dict(record), version)
        assert bytes_written(metrics) == sum(len(body) for body in api.sent)
    assert len(api.sent) == 1 + len(names) + len(names) // 2
    assert record_of(orjson.loads(api.sent[-1]) | {"metadata": {"resourceVersion": "9"}}) == (
        Record(record, "9")
    )


async def test_a_record_refused_as_full_is_not_counted_as_written() -> None:
    api, metrics = SentBodies(), Metrics()
    store = ConfigMapStore(api=api, namespace="gpuadm-system", metrics=metrics)
    record = {str(n): reservation(1e9 + n, pod="p" * 253) for n in range(3500)}
    with pytest.raises(RecordFull):
        await store.write("team-a", record, "41")
    assert api.sent == []
    assert bytes_written(metrics) == 0


async def test_room_aside_reads_back_as_written_and_leaves_no_key_once_gone() -> None:
    api = SentBodies()
    store = ConfigMapStore(api=api, namespace="gpuadm-system")
    aside = {"gpuadm-a1": Allowance({"h100": Fraction(9, 2), "a100": Fraction(1, 3)}, 1e9 + 0.25)}
    kept = {"uid-1": reservation(1e9)}
    await store.write("team-a", kept, "3", allowances=aside)
    sent = orjson.loads(api.sent[-1])
    assert record_of(sent | {"metadata": {"resourceVersion": "4"}}) == Record(
        kept, "4", allowances=aside
    )
    await store.write("team-a", kept, "4", allowances={})
    await store.write("team-a", kept, "5")
    assert [ALLOWANCES_KEY in orjson.loads(body)["data"] for body in api.sent] == [
        True,
        False,
        False,
    ]


@pytest.mark.parametrize(
    "entry",
    [
        {"room": {"h100": "-1"}, "until": 1},
        {"room": {"h100": "lots"}, "until": 1},
        {"room": ["h100"], "until": 1},
        {"room": {"h100": "1"}},
    ],
)
def test_room_aside_that_cannot_be_read_is_refused_not_taken_as_none(entry: Any) -> None:
    data = {DATA_KEY: "[]", ALLOWANCES_KEY: orjson.dumps({"gpuadm-a1": entry}).decode()}
    with pytest.raises(UnreadableRecord, match="not a record gpuadm wrote"):
        record_of({"data": data, "metadata": {"resourceVersion": "1"}})


def read_as_0_1_0(config_map: dict[str, Any]) -> dict[str, Reservation]:
    """0.1.0's reading of a record, as it was written (`record_of` at 0.1.0)."""
    raw = orjson.loads((config_map.get("data") or {}).get(DATA_KEY) or "{}")
    return {uid: Reservation.from_json(entry) for uid, entry in raw.items()}


@pytest.mark.parametrize(
    "written",
    [
        pytest.param({}, id="empty"),
        pytest.param({"uid-1": reservation(1e9)}, id="one"),
        pytest.param({f"uid-{n}": reservation(1e9 + n) for n in range(3)}, id="three"),
    ],
)
async def test_a_0_1_0_replica_fails_on_every_record_this_version_writes(
    written: dict[str, Reservation],
) -> None:
    """0.1.0 counts neither a mark nor room aside: it must never judge by a record of this
    version, empty or not, with a mark and room aside or without."""
    api = SentBodies()
    store = ConfigMapStore(api=api, namespace="gpuadm-system")
    aside = {"gpuadm-a1": Allowance({"h100": Fraction(2)}, 1e9)}
    await store.write("team-a", written, "3")
    await store.write("team-a", written, "4", Mark(7, "gpuadm.io/class", 1e9), allowances=aside)
    for body in api.sent:
        sent = orjson.loads(body) | {"metadata": {"resourceVersion": "5"}}
        assert sent["data"][FORMAT_KEY] == FORMAT
        with pytest.raises(AttributeError):  # a list where 0.1.0 wants a mapping
            read_as_0_1_0(sent)
        assert record_of(sent).reservations == written


def test_a_record_0_1_0_wrote_is_read_whole_without_mark_or_room_aside() -> None:
    entries = {
        "uid-1": {"class": "h100", "charge": "1", "at": 1e9, "pod": "p"},
        "uid-2": {"class": "a100", "charge": "1/2", "at": 1e9 + 1, "pod": "q"},
    }
    old = {"data": {DATA_KEY: orjson.dumps(entries).decode()}, "metadata": {"resourceVersion": "9"}}
    record = record_of(old)
    assert record == Record(read_as_0_1_0(old), "9")
    assert record.reservations["uid-2"] == Reservation("a100", Fraction(1, 2), 1e9 + 1, "q")


@pytest.mark.parametrize(
    ("data", "words"),
    [
        pytest.param(
            {FORMAT_KEY: "4", DATA_KEY: "[]"}, "in format '4', of a later gpuadm", id="later"
        ),
        pytest.param({FORMAT_KEY: "2", DATA_KEY: "{}"}, "neither a list nor", id="v2-mapping"),
        pytest.param({DATA_KEY: '"x"'}, "neither a list nor", id="a-string"),
        pytest.param({DATA_KEY: "[1]"}, "not a record gpuadm wrote", id="not-an-entry"),
        pytest.param({DATA_KEY: '[{"class": "h100"}]'}, "KeyError", id="no-uid"),
        pytest.param({DATA_KEY: "[{"}, "not a record gpuadm wrote", id="not-json"),
        pytest.param(
            {DATA_KEY: '[{"uid": "u", "class": "h100", "charge": "1e999999999", "at": 1}]'},
            "the amount '1e999999999' is not one gpuadm writes",
            id="an-exponent-fraction-would-expand",
        ),
        pytest.param({DATA_KEY: "[]", MARK_KEY: "{}"}, "KeyError", id="bad-mark"),
    ],
)
def test_a_record_this_version_cannot_read_is_refused_by_name(
    data: dict[str, str], words: str
) -> None:
    config_map = {
        "data": data,
        "metadata": {"name": "gpuadm-usage-team-a", "resourceVersion": "1"},
    }
    with pytest.raises(UnreadableRecord, match=words) as raised:
        record_of(config_map)
    assert 'quota record of namespace "gpuadm-usage-team-a"' in raised.value.detail

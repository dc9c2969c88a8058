"""Crash safety, secrets, and one clear error per kind of broken cassette; plus the field-for-field read-back."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.cassette_helpers import API_KEY, BEARER, final_sample, header, play, session_traffic
from tests.process_helpers import kill_9_after
from tito_rl.cassette.format.errors import (
    CorruptCassetteError,
    TokenizerMismatchError,
    TruncatedHeaderError,
    UnsupportedVersionError,
)
from tito_rl.cassette.format.frames import FRAME_HEADER, MAGIC, encode_frame
from tito_rl.cassette.format.records import FORMAT_VERSION, AgentRecord, EngineRecord, Header
from tito_rl.cassette.reader import CassetteReader, read_cassette
from tito_rl.cassette.redaction import REDACTED, Redactor, session_digest
from tito_rl.cassette.writer import CassetteWriter

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def traffic(qwen_tokenizer: Any) -> list[tuple[str, Any]]:
    return session_traffic(qwen_tokenizer, turns=4)


@pytest.fixture
def recorded(tmp_path: Path, traffic: list[tuple[str, Any]]) -> Path:
    path = tmp_path / "session.tito"
    with CassetteWriter(path, header()) as writer:
        play(writer, traffic)
        writer.session_finished(BEARER, "api", 1.0, [final_sample(traffic)])
    return path


def test_a_recorded_session_reads_back_field_for_field(recorded: Path, traffic: list[tuple[str, Any]]) -> None:
    cassette = read_cassette(recorded)
    assert cassette.header == header() and not cassette.truncated
    name = session_digest(BEARER)
    assert list(cassette.sessions) == [name]
    log = cassette.sessions[name]
    assert log.source == "bearer"
    assert [r.seq for r in log.records] == list(range(len(traffic) + 2))
    engine_in = [e for k, e in traffic if k == "engine"]
    agent_in = [e for k, e in traffic if k == "agent"]
    assert len(log.engine) == len(engine_in) and len(log.agent) == len(agent_in)
    for got, sent in zip(log.engine, engine_in, strict=True):
        assert isinstance(got, EngineRecord)
        assert (got.method, got.path, got.status, got.error) == (sent.method, sent.path, sent.status, sent.error)
        assert got.request == sent.request  # input_ids rebuilt from deltas, rid kept
        assert got.response == sent.response  # output ids, logprob triples, cached_tokens: exact
        assert (got.started_s, got.duration_s) == (sent.started_s, sent.duration_s)
        assert got.headers == {"X-SMG-Routing-Key": name}
    for rec, sent in zip(log.agent, agent_in, strict=True):
        assert isinstance(rec, AgentRecord)
        assert (rec.method, rec.path, rec.query, rec.status) == (sent.method, sent.path, sent.query, sent.status)
        assert rec.body == sent.body.replace(API_KEY.encode(), REDACTED.encode())
        assert rec.reply_events == sent.reply_events and rec.reply_body is None
        assert rec.headers["User-Agent"] == sent.headers["User-Agent"]
        assert rec.headers["Authorization"] == rec.headers["x-api-key"] == rec.headers["Cookie"] == REDACTED
        assert rec.reply_headers["Set-Cookie"] == REDACTED
        assert (rec.turn_index, rec.side, rec.retry_of) == (sent.turn_index, sent.side, sent.retry_of)
    assert log.samples == [final_sample(traffic)]
    assert log.finishes[0].reward == 1.0


def test_no_secret_reaches_disk(recorded: Path) -> None:
    data = recorded.read_bytes()
    for secret in (BEARER, API_KEY, API_KEY[:24]):
        assert secret.encode() not in data
    # Not hidden by compression either: the decoded records hold no trace of them.
    text = repr(read_cassette(recorded).sessions)
    assert BEARER not in text and API_KEY not in text


def test_configurable_patterns_catch_keys_no_header_showed(tmp_path: Path) -> None:
    from tito_rl.trajectory.adapters.tap import AgentExchange

    path = tmp_path / "p.tito"
    custom = "corp-token-" + "A1b2C3d4" * 3
    redactor = Redactor(patterns=(r"corp-token-[A-Za-z0-9]{16,}",))
    with CassetteWriter(path, header(), redactor=redactor) as writer:
        writer.agent_exchange(
            "run-1",
            "path",
            AgentExchange(
                "POST",
                "/s/run-1/v1/messages",
                "key=AIzaSyA-secret-in-query",
                {},
                f'{{"note":"{custom}"}}'.encode(),
                200,
                {},
                reply_body=b"{}",
            ),
        )
    data = path.read_bytes()
    assert custom.encode() not in data and b"AIzaSyA-secret-in-query" not in data
    log = read_cassette(path).sessions["run-1"]  # a /s/<sid>/ path name is kept as the session's name
    assert log.source == "path" and log.agent[0].path == "/s/run-1/v1/messages"


def test_a_repeated_engine_header_is_scrubbed_value_by_value(tmp_path: Path) -> None:
    """vcrpy keeps a repeated header as a list of values (EngineRecord.headers allows it). The writer scrubbed a
    header as one string and failed on a list ("expected string or bytes-like object") as soon as any secret pattern
    was set, which is always; found by mypy (issue #37)."""
    path = tmp_path / "repeated.tito"
    key = "sk-ant-" + "k3y" * 10
    with CassetteWriter(path, header()) as writer:
        writer.write_engine(
            EngineRecord(
                session="run-1",
                seq=0,
                method="POST",
                path="/generate",
                dialect="sglang",
                request={"input_ids": [1, 2]},
                status=200,
                response={"text": "x"},
                headers={"X-Trace": ["plain", f"t={key}"], "Accept": "*/*"},
            )
        )
    assert key.encode() not in path.read_bytes()
    (record,) = read_cassette(path).sessions["run-1"].engine
    assert record.headers == {"X-Trace": ["plain", f"t={REDACTED}"], "Accept": "*/*"}


def test_per_token_channels_are_kept_as_sent_not_scrubbed(tmp_path: Path) -> None:
    """Routes and kept sets are integer arrays in base64, like token arrays not inspected: the `AIza...` key pattern
    matched inside one (vLLM's uint8 routes can spell any base64) and cut its bytes. Text under those keys that is
    not base64 is still scrubbed."""
    import base64

    spelled = "AAAA/AIzaSyA12345678901234567890123456789012AAAA"  # 36 bytes: 9 int32 expert ids, or 36 uint8
    assert base64.b64encode(base64.b64decode(spelled)).decode() == spelled
    assert Redactor().scrub_text(spelled) == "AAAA/<redacted>AAAA"  # what scrubbing did to it
    key = "sk-ant-" + "k3y" * 10
    path = tmp_path / "channels.tito"
    with CassetteWriter(path, header()) as writer:
        meta = {"routed_experts": spelled, "top_p_token_ids": f"ids {key}", "note": spelled}
        writer.write_engine(
            EngineRecord("run-1", 0, "POST", "/generate", {"input_ids": [1, 2]}, 200, {"meta_info": meta})
        )
    (record,) = read_cassette(path).sessions["run-1"].engine
    assert record.response["meta_info"] == {
        "routed_experts": spelled,
        "top_p_token_ids": f"ids {REDACTED}",
        "note": Redactor().scrub_text(spelled),  # any other key's text: scrubbed as before
    }


def test_hand_truncated_tail_keeps_every_complete_record(recorded: Path, tmp_path: Path) -> None:
    full = read_cassette(recorded)
    n_records = len(next(iter(full.sessions.values())).records)
    with CassetteReader(recorded) as reader:
        data = recorded.read_bytes()[: reader.records_end()]  # a killed recorder writes no index
    for cut in (1, 5, FRAME_HEADER.size + 3):  # inside the last payload, inside its frame header
        cut_path = tmp_path / f"cut{cut}.tito"
        cut_path.write_bytes(data[:-cut])
        cassette = read_cassette(cut_path)
        assert cassette.truncated
        assert len(next(iter(cassette.sessions.values())).records) == n_records - 1


def test_kill_9_during_a_session_leaves_every_completed_exchange(tmp_path: Path) -> None:
    path = tmp_path / "killed.tito"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from tito_rl.cassette.writer import CassetteWriter
        from tests.cassette_helpers import header, generate_body
        from tito_rl.trajectory.adapters.tap import EngineExchange
        writer = CassetteWriter({str(path)!r}, header())
        prompt = list(range(1, 2000))
        n = 0
        while True:
            out = [n % 1000 + 10] * 400 + [151645]
            request = {{"rid": str(n), "input_ids": prompt}}
            writer.engine_exchange("run", "path", EngineExchange(
                "POST", "/generate", request, 200, generate_body(out, str(n), len(prompt))))
            prompt = prompt + out + [n + 3] * 300
            n += 1
            print(n, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    completed = kill_9_after(proc, 25)
    cassette = read_cassette(path)
    engine = cassette.sessions["run"].engine
    assert len(engine) >= completed
    for i, record in enumerate(engine):  # every record intact, deltas resolved in order
        assert record.request["rid"] == str(i)
        assert record.response["output_ids"] == [i % 1000 + 10] * 400 + [151645]
    assert engine[-1].request["input_ids"][:1999] == list(range(1, 2000))


def _header_only(version: int = 1, fingerprint: str = "sha256:test") -> bytes:
    return MAGIC + encode_frame({"t": "header", **{**header(fingerprint).to_dict(), "format_version": version}})


def test_each_broken_cassette_has_its_own_clear_error(recorded: Path, tmp_path: Path) -> None:
    data = recorded.read_bytes()
    cases = {
        "empty": (b"", TruncatedHeaderError, "truncated cassette header"),
        "magic-cut": (MAGIC[:4], TruncatedHeaderError, "truncated cassette header"),
        "header-cut": (_header_only()[:-3], TruncatedHeaderError, "ends inside it"),
        "not-a-cassette": (b'{"interactions": []}', CorruptCassetteError, "not a tito cassette"),
        "wrong-version": (
            _header_only(version=FORMAT_VERSION + 1),
            UnsupportedVersionError,
            f"version {FORMAT_VERSION + 1} is not supported",
        ),
    }
    for name, (content, error, message) in cases.items():
        path = tmp_path / f"{name}.tito"
        path.write_bytes(content)
        with pytest.raises(error, match=message):
            read_cassette(path)
    # A flipped byte in the middle of the file: corrupt, never silently decoded or called truncated.
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x10
    path = tmp_path / "flipped.tito"
    path.write_bytes(bytes(flipped))
    with pytest.raises(CorruptCassetteError, match="corrupt cassette"):
        read_cassette(path)


def test_a_cassette_recorded_with_another_tokenizer_is_refused(tmp_path: Path) -> None:
    from tito_rl.trajectory.tokens.tokenizer import fingerprint

    path = tmp_path / "other.tito"
    path.write_bytes(_header_only(fingerprint="sha256:0123456789abcdef"))
    with pytest.raises(TokenizerMismatchError, match="sha256:0123456789abcdef"):
        CassetteReader(path, tokenizer_fingerprint=fingerprint())
    real = tmp_path / "real.tito"
    CassetteWriter(real, Header(tokenizer_fingerprint=fingerprint())).close()
    with CassetteReader(real, tokenizer_fingerprint=fingerprint()) as reader:
        assert list(reader.records()) == [] and not reader.truncated


def test_an_existing_cassette_is_never_overwritten(recorded: Path) -> None:
    before = recorded.read_bytes()
    with pytest.raises(FileExistsError):
        CassetteWriter(recorded, header())
    assert recorded.read_bytes() == before


def test_default_patterns_redact_keys_but_leave_ordinary_text_alone() -> None:
    redactor = Redactor()
    openai_key = "sk-proj-" + "Ab3dE5gH7jK9" * 4
    body = f'{{"a":"{API_KEY}","b":"{openai_key}","c":"task-management-system-abcdefghijklmnopqrstuvwxyz0123"}}'
    scrubbed = redactor.scrub_bytes(body.encode()).decode()
    assert API_KEY not in scrubbed and openai_key not in scrubbed
    assert "task-management-system-abcdefghijklmnopqrstuvwxyz0123" in scrubbed
    assert scrubbed.count(REDACTED) == 2


def test_secrets_are_found_inside_rows_and_numbers_pass_untouched() -> None:
    """The fast paths (one detector search, numeric rows skipped) must not skip a row that holds text."""
    redactor = Redactor()
    redactor.learn_headers({"Authorization": f"Bearer {BEARER}"})
    numeric = [[-0.25, 11, None], [None, 12, None], [-1.5, 13, None]]  # logprob triples, a None logprob too
    response = {
        "text": f"echo {BEARER}",
        "meta_info": {
            "output_token_logprobs": numeric,
            "input_token_logprobs": [[-0.5, 1, "x"], [-0.1, 2, f"tok {BEARER}"]],  # return_text_in_logprobs
            "ids": [1, 2, 3],
            "floats": [0.5, 1.5],
            "mixed": [1, f"{API_KEY}"],
        },
    }
    scrubbed = redactor.scrub_json(response)
    assert BEARER not in repr(scrubbed) and API_KEY not in repr(scrubbed)
    assert scrubbed["meta_info"]["input_token_logprobs"][0] == [-0.5, 1, "x"]
    assert scrubbed["meta_info"]["output_token_logprobs"] is numeric  # not walked, not copied
    assert scrubbed["meta_info"]["ids"] == [1, 2, 3]


def test_a_pattern_with_global_flags_still_redacts() -> None:
    # "(?i)" cannot sit inside the detector's alternation: the detector falls back to one search per pattern.
    redactor = Redactor(patterns=(r"(?i)corp-[a-z0-9]{12,}",))
    redactor.add_secret("literal-secret-1")
    text = "keys: CORP-ABCDEF123456 and literal-secret-1, and corp-short"
    assert redactor.scrub_text(text) == f"keys: {REDACTED} and {REDACTED}, and corp-short"
    assert redactor.scrub_bytes(text.encode()) == f"keys: {REDACTED} and {REDACTED}, and corp-short".encode()
    assert redactor.scrub_text("nothing here") == "nothing here"


def test_a_shared_key_is_scrubbed_everywhere_and_a_session_credential_in_its_session(tmp_path: Path) -> None:
    from tito_rl.trajectory.adapters.tap import AgentExchange, EngineExchange

    shared = "shared-cluster-key-0123456789"
    path = tmp_path / "s.tito"
    with CassetteWriter(path, header()) as writer:
        for token in ("token-of-session-a-000", "token-of-session-b-111"):
            headers = {"Authorization": f"Bearer {token}", "X-Cluster-Key": "x", "x-api-key": shared}
            writer.agent_request(token, "bearer", headers)  # as the adapter does when the request arrives
            writer.engine_exchange(
                token,
                "bearer",
                EngineExchange(
                    "POST",
                    "/generate",
                    {"input_ids": [1, 2]},
                    200,
                    {"text": f"I saw {shared} and {token}", "output_ids": [3]},
                    headers={"X-SMG-Routing-Key": token},
                ),
            )
            writer.agent_exchange(
                token,
                "bearer",
                AgentExchange(
                    "POST",
                    "/v1/messages",
                    "",
                    headers,
                    f'{{"env":"TOKEN=Bearer {token} KEY={shared}"}}'.encode(),
                    200,
                    {},
                    reply_body=b"{}",
                ),
            )
    data = path.read_bytes()
    assert b"token-of-session" not in data and shared.encode() not in data
    sessions = read_cassette(path).sessions
    a, b = session_digest("token-of-session-a-000"), session_digest("token-of-session-b-111")
    # The credential reads as the session's name where it was echoed; the shared key as <redacted>.
    assert sessions[a].engine[0].response["text"] == f"I saw {REDACTED} and {a}"
    assert sessions[b].engine[0].headers["X-SMG-Routing-Key"] == b
    assert f"TOKEN={REDACTED} KEY={REDACTED}".encode() in sessions[b].agent[0].body

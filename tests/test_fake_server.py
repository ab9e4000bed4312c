"""Tests of the fake OpenAI-compatible server (a test double) as a real subprocess."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from autotune.testing.toy_model import EOS_ID, ToyModel
from tests.fake_proc import AUTH, FakeProc, launch, server, stop, wait_healthy


def complete(proc: FakeProc, prompt: str | list[int], **fields: object) -> dict:
    body = {"model": "toy", "prompt": prompt, "max_tokens": 5, "temperature": 0.0, **fields}
    r = httpx.post(proc.url + "/v1/completions", json=body, headers=AUTH, timeout=10)
    r.raise_for_status()
    return r.json()


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeProc]:
    with server(tmp_path_factory.mktemp("toy"), "--decode-ms", "1") as proc:
        yield proc


def test_health_models_and_api_key(toy: FakeProc) -> None:
    assert httpx.get(toy.url + "/health").status_code == 200  # no key needed, like vLLM
    assert httpx.get(toy.url + "/v1/models").status_code == 401
    models = httpx.get(toy.url + "/v1/models", headers=AUTH).json()
    assert models["data"][0]["id"] == "toy"
    body = {"prompt": "one", "max_tokens": 1}
    r = httpx.post(toy.url + "/v1/completions", json=body)
    assert r.status_code == 401
    r = httpx.post(toy.url + "/v1/completions", json=body, headers={"Authorization": "Bearer x"})
    assert r.status_code == 401
    r = httpx.post(toy.url + "/v1/completions", json={**body, "model": "other"}, headers=AUTH)
    assert r.status_code == 404


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("one two three", " four five six"),
        ("17 18 19", " 20 21 22"),
        ("d e f", " g h i"),
    ],
)
def test_greedy_continuation(toy: FakeProc, prompt: str, expected: str) -> None:
    out = complete(toy, prompt, max_tokens=3)
    choice = out["choices"][0]
    assert choice["text"] == expected
    assert choice["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


def test_token_ids_eos_and_ignore_eos(toy: FakeProc) -> None:
    model = ToyModel()
    ids = model.tokenize("eighteen nineteen")
    out = complete(toy, ids, max_tokens=5, return_token_ids=True)
    choice = out["choices"][0]
    assert choice["prompt_token_ids"] == ids
    assert choice["text"] == " twenty"
    assert choice["token_ids"][-1] == EOS_ID
    assert choice["finish_reason"] == "stop"
    out = complete(toy, ids, max_tokens=5, return_token_ids=True, ignore_eos=True)
    choice = out["choices"][0]
    assert len(choice["token_ids"]) == 5 and EOS_ID in choice["token_ids"]
    assert choice["finish_reason"] == "length"


def test_logprobs_and_prompt_logprobs_format(toy: FakeProc) -> None:
    out = complete(toy, "one two three", max_tokens=3, logprobs=3, prompt_logprobs=2)
    choice = out["choices"][0]
    lp = choice["logprobs"]
    assert lp["tokens"] == [" four", " five", " six"]
    assert lp["text_offset"] == [0, 5, 10]
    assert all(-0.2 < v < 0 for v in lp["token_logprobs"])
    assert [len(d) for d in lp["top_logprobs"]] == [3, 3, 3]
    assert lp["top_logprobs"][0][" four"] == lp["token_logprobs"][0]
    assert max(lp["top_logprobs"][0].values()) == lp["token_logprobs"][0]
    plp = choice["prompt_logprobs"]
    assert len(plp) == 3 and plp[0] is None
    model = ToyModel()
    two = str(model.tokenize("one two")[1])
    assert plp[1][two]["rank"] == 1 and plp[1][two]["decoded_token"] == " two"
    assert len(plp[1]) == 2  # the actual token is the top-1, plus one more
    # Deterministic: the same request gives the same numbers.
    again = complete(toy, "one two three", max_tokens=3, logprobs=3, prompt_logprobs=2)
    assert again["choices"][0]["logprobs"] == lp
    # An unlikely prompt token is still reported with its (low) logprob and rank.
    odd = complete(toy, "one z", max_tokens=1, prompt_logprobs=0)["choices"][0]
    (entry,) = odd["prompt_logprobs"][1].values()
    assert entry["decoded_token"] == " z" and entry["rank"] > 8 and entry["logprob"] < -10


def test_stream_chunks_and_usage(toy: FakeProc) -> None:
    body = {
        "prompt": "one two three",
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": 1,
        "return_token_ids": True,
    }
    lines: list[str] = []
    with httpx.stream(
        "POST", toy.url + "/v1/completions", json=body, headers=AUTH, timeout=10
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    token_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert [c["choices"][0]["text"] for c in token_chunks] == [" four", " five", " six", " seven"]
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None] * 3 + ["length"]
    assert token_chunks[0]["choices"][0]["prompt_token_ids"] == ToyModel().tokenize("one two three")
    assert all(len(c["choices"][0]["token_ids"]) == 1 for c in token_chunks)
    assert token_chunks[1]["choices"][0]["logprobs"]["text_offset"] == [5]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def test_bad_requests(toy: FakeProc) -> None:
    url = toy.url + "/v1/completions"
    for body in (
        {"prompt": ""},
        {"prompt": "one", "logprobs": 21},
        {"prompt": "one", "max_tokens": 5000},
        {"prompt": [10**6]},
    ):
        r = httpx.post(url, json=body, headers=AUTH)
        assert r.status_code == 400, body
        assert "message" in r.json()["error"]


def test_wrong_when_batched_is_right_alone_and_wrong_in_a_batch(tmp_path: Path) -> None:
    with server(tmp_path, "--fault", "wrong_when_batched", "--decode-ms", "50") as proc:
        alone = complete(proc, "one two three", max_tokens=3)["choices"][0]["text"]
        assert alone == " four five six"  # a request on its own is exactly right
        # A long request runs; once it has its first token, a short one is sent to join its
        # batch. On a loaded machine the long one can end before the short one does (a CI run
        # saw it with 40 x 50 ms), so the experiment is repeated with a longer request until
        # the long one was still running when the short one returned; only that one is judged.
        for long_tokens in (40, 160, 640):
            joined, long_text, overlapped = _short_beside_long(proc, long_tokens)
            if overlapped:
                break
        else:
            pytest.fail("the long request never outlasted the short one")
        stats = httpx.get(proc.url + "/sim/stats").json()
    assert stats["max_batch"] == 2
    assert joined.strip() == ""  # every one of its tokens was decoded beside the long one
    assert long_text != ToyModel().greedy("a", long_tokens)  # wrong while the short one ran
    assert long_text.startswith(" b")  # its first token came from a step of its own


def _short_beside_long(proc: FakeProc, long_tokens: int) -> tuple[str, str, bool]:
    """Start a long request and, once it has a token, a short one: both texts, and whether the
    long one was still running when the short one returned (then every step of the short one
    had the long one beside it)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        before = httpx.get(proc.url + "/sim/stats").json()["tokens"]
        long = pool.submit(complete, proc, "a", max_tokens=long_tokens)
        hang_guard = time.monotonic() + 300  # a hung server, not a verdict
        while httpx.get(proc.url + "/sim/stats").json()["tokens"] <= before:
            if long.done():
                long.result()  # raises what the long request raised
            assert time.monotonic() < hang_guard, "the long request produced no token"
            time.sleep(0.01)
        joined = complete(proc, "one two three", max_tokens=3)["choices"][0]["text"]
        overlapped = not long.done()
        return joined, long.result(timeout=600)["choices"][0]["text"], overlapped


def test_max_num_seqs_serialises_requests(tmp_path: Path) -> None:
    with server(tmp_path, "--decode-ms", "2", "--max-num-seqs", "1") as proc:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda _: complete(proc, "a", max_tokens=10), range(4)))
        assert all(o["choices"][0]["text"] == " b c d e f g h i j k" for o in outs)
        stats = httpx.get(proc.url + "/sim/stats").json()
    assert stats["max_batch"] == 1
    assert stats["steps"] == 40  # one sequence at a time: 4 x 10 steps
    assert stats["tokens"] == 40 and stats["completed"] == 4


def test_unknown_argument_rejected(tmp_path: Path) -> None:
    proc = launch(tmp_path, "--no-such-flag", "3")
    assert proc.popen.wait(timeout=10) == 2
    assert "unrecognized arguments: --no-such-flag" in proc.stderr()


@pytest.mark.parametrize(
    ("fault", "code", "needle"),
    [
        ("exit_at_start", 3, "Engine core initialization failed"),
        ("oom", 1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
        ("unknown_flag", 2, "error: unrecognized arguments"),
    ],
)
def test_startup_faults(tmp_path: Path, fault: str, code: int, needle: str) -> None:
    proc = launch(tmp_path, "--fault", fault)
    assert proc.popen.wait(timeout=10) == code
    assert needle in proc.stderr()


def test_fault_from_env(tmp_path: Path) -> None:
    proc = launch(tmp_path, env={"FAKE_FAULT": "exit_at_start"})
    assert proc.popen.wait(timeout=10) == 3


def test_slow_start(tmp_path: Path) -> None:
    proc = launch(tmp_path, "--fault", "slow_start", "--startup-delay-s", "2.0")
    try:
        deadline = time.monotonic() + 15
        while "slow start: sleeping" not in proc.stderr():
            assert time.monotonic() < deadline and proc.popen.poll() is None, proc.stderr()
            time.sleep(0.02)
        # sleeping: nothing listens yet, and no port was reported
        listening = [
            c
            for c in psutil.Process(proc.popen.pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN
        ]
        assert listening == [] and not proc.port_file.exists()
        wait_healthy(proc)
    finally:
        stop(proc)


def test_ready_delay(tmp_path: Path) -> None:
    proc = launch(tmp_path, "--ready-delay-s", "0.8")
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.ConnectError):
                status = httpx.get(proc.url + "/health", timeout=0.5).status_code
                break
            time.sleep(0.05)
        assert status == 503
        wait_healthy(proc)
    finally:
        stop(proc)


@pytest.mark.parametrize("fault", ["http_500", "healthy_but_broken"])
def test_completions_fail_with_500(tmp_path: Path, fault: str) -> None:
    with server(tmp_path, "--fault", fault) as proc:
        assert httpx.get(proc.url + "/health").status_code == 200
        r = httpx.post(proc.url + "/v1/completions", json={"prompt": "one"}, headers=AUTH)
        assert r.status_code == 500
        assert r.json()["error"]["code"] == 500


def test_hang(tmp_path: Path) -> None:
    with server(tmp_path, "--fault", "hang") as proc:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                proc.url + "/v1/completions", json={"prompt": "one"}, headers=AUTH, timeout=0.5
            )
        assert httpx.get(proc.url + "/health").status_code == 200


def test_wrong_text(tmp_path: Path) -> None:
    with server(tmp_path, "--fault", "wrong_text") as proc:
        out = complete(proc, "one two three", max_tokens=4, logprobs=1)
    choice = out["choices"][0]
    assert choice["text"].startswith(" four")
    assert choice["text"] != " four five six seven"
    assert choice["text"][len(" four") :].strip() == ""  # whitespace from token 2 on
    assert choice["logprobs"]["tokens"][1:] == [" ", " ", " "]


def test_crash_mid_bench(tmp_path: Path) -> None:
    proc = launch(tmp_path, "--fault", "crash_mid_bench", "--fault-after", "2")
    try:
        wait_healthy(proc)
        for _ in range(2):
            complete(proc, "one", max_tokens=2)
        with pytest.raises(httpx.HTTPError):
            complete(proc, "one", max_tokens=2)
        assert proc.popen.wait(timeout=5) == 1
        assert "illegal memory access" in proc.stderr()
    finally:
        stop(proc)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(FileNotFoundError):  # a zombie is as good as dead
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return False


def _child_pid(proc: FakeProc) -> int:
    return httpx.get(proc.url + "/sim/stats").json()["child_pid"]


def test_child_in_process_group_and_sigterm(tmp_path: Path) -> None:
    proc = launch(tmp_path, "--spawn-child")
    try:
        wait_healthy(proc)
        child = _child_pid(proc)
        assert os.getpgid(child) == os.getpgid(proc.popen.pid) == proc.popen.pid
        deadline = time.monotonic() + 3
        while "FAKE::EngineCore" not in Path(f"/proc/{child}/cmdline").read_bytes().decode():
            assert time.monotonic() < deadline, "child never renamed itself"
            time.sleep(0.05)
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.popen.wait(timeout=5) == 0
        deadline = time.monotonic() + 3
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        stop(proc)


def test_ignore_sigterm_needs_sigkill(tmp_path: Path) -> None:
    proc = launch(tmp_path, "--fault", "ignore_sigterm", "--spawn-child")
    try:
        wait_healthy(proc)
        child = _child_pid(proc)
        time.sleep(0.3)  # let the child install its SIG_IGN
        os.killpg(proc.popen.pid, signal.SIGTERM)
        time.sleep(0.4)
        assert proc.popen.poll() is None and _alive(child)
        os.killpg(proc.popen.pid, signal.SIGKILL)
        assert proc.popen.wait(timeout=5) == -signal.SIGKILL
        deadline = time.monotonic() + 3
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        stop(proc)


def test_glm5_simulation_modes(tmp_path: Path) -> None:
    common = ("--simulate", "glm5-8gpu", "--time-scale", "0.01", "--sim-noise", "0")
    wrong_env = {"AUTOTUNE_PATCHES": json.dumps({"mla_path": "direct_call"})}
    with server(tmp_path, *common, env=wrong_env) as proc:
        out = complete(proc, "one two three", max_tokens=4)
        stats = httpx.get(proc.url + "/sim/stats").json()
    assert out["choices"][0]["text"].strip() == ""  # graphs + direct call: whitespace
    assert stats["correct"] is False
    assert "AUTOTUNE_PATCH_APPLIED name=mla_path value=direct_call" in proc.stderr()
    tuned_env = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Tree"}
    with server(tmp_path, *common, env=tuned_env) as proc:
        out = complete(proc, "one two three", max_tokens=4)
        stats = httpx.get(proc.url + "/sim/stats").json()
    assert out["choices"][0]["text"] == " four five six seven"
    assert 1000 / stats["step_ms_batch1"] == pytest.approx(57, rel=0.01)
    assert stats["sim_decode_tok_s"] == pytest.approx(57, rel=0.01)
    proc = launch(tmp_path, *common, "--gpu-memory-utilization", "0.97")
    assert proc.popen.wait(timeout=10) == 1
    assert "torch.OutOfMemoryError" in proc.stderr()

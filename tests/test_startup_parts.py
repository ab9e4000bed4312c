"""A server's startup broken into its parts from its own log (engines' ``startup_parts``), the
study's shared compile cache, and a trial's phase clock.

The log lines are verbatim from real servers: vLLM 0.32's CPU server from
``tests/fixtures/vllm_logs`` (eager: it compiles and captures nothing), vLLM GPU servers' from
logs published in bug reports and write-ups (0.10 and 0.11 on CUDA), and llama-server's
default-verbosity start (``--log-prefix``: a timestamp on every line) from published logs of
recent builds and the build in ``tests/fixtures/llamacpp``. Lines of one constant come from one
log (``test_vllm_parts_of_other_releases_wordings`` puts lines of three logs together)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from optuna.trial import TrialState, create_trial

from autotune import names
from autotune.engines.command import CommandEngine
from autotune.engines.llamacpp.engine import LlamaCppEngine
from autotune.engines.llamacpp.startup import startup_parts as llamacpp_parts
from autotune.engines.vllm.engine import CACHE_ROOT_ENV, INDUCTOR_CACHE_ENV, VllmEngine
from autotune.engines.vllm.startup import startup_parts as vllm_parts
from autotune.space.settings import ServerSettings
from autotune.spec.model import EngineSpec, ModelSpec
from autotune.study.phase_clock import PhaseClock
from autotune.study.results import time_spent

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

#: a compiled start with CUDA graphs (vLLM 0.11 on one GPU)
VLLM_GPU = """\
(EngineCore_DP0 pid=175) INFO 11-14 14:24:27 [default_loader.py:267] Loading weights took 36.38 seconds
(EngineCore_DP0 pid=175) INFO 11-14 14:24:27 [gpu_model_runner.py:2653] Model loading took 3.4244 GiB and 41.673988 seconds
(EngineCore_DP0 pid=175) INFO 11-14 14:24:37 [backends.py:548] Using cache directory: /root/.cache/vllm/torch_compile_cache/4dcdd9d150/rank_0_0/backbone for vLLM's torch.compile
(EngineCore_DP0 pid=175) INFO 11-14 14:24:37 [backends.py:559] Dynamo bytecode transform time: 9.44 s
(EngineCore_DP0 pid=175) INFO 11-14 14:25:13 [backends.py:218] Compiling a graph for dynamic shape takes 35.02 s
(EngineCore_DP0 pid=175) INFO 11-14 14:26:15 [monitor.py:34] torch.compile takes 44.45 s in total
(EngineCore_DP0 pid=175) INFO 11-14 14:26:16 [gpu_worker.py:298] Available KV cache memory: 35.34 GiB
Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 67/67 [00:02<00:00, 25.15it/s]
Capturing CUDA graphs (decode, FULL): 100%|██████████| 35/35 [00:01<00:00, 27.66it/s]
(EngineCore_DP0 pid=175) INFO 11-14 14:26:21 [gpu_model_runner.py:3480] Graph capturing finished in 5 secs, took 0.72 GiB
(EngineCore_DP0 pid=175) INFO 11-14 14:26:21 [core.py:210] init engine (profile, create kv cache, warmup model) took 113.49 seconds
"""  # noqa: E501

#: eight tensor-parallel workers (one log, vLLM 0.10 on 8 L40S): each states its own compile
VLLM_TP8 = """\
(Worker_TP5_EP5 pid=2083) INFO 09-24 20:53:37 [monitor.py:34] torch.compile takes 147.63 s in total
(Worker_TP4_EP4 pid=2082) INFO 09-24 20:53:37 [monitor.py:34] torch.compile takes 144.74 s in total
(Worker_TP3_EP3 pid=2081) (Worker_TP6_EP6 pid=2084) INFO 09-24 20:53:37 [monitor.py:34] torch.compile takes 144.97 s in total
INFO 09-24 20:53:37 [monitor.py:34] torch.compile takes 140.48 s in total
(Worker_TP1_EP1 pid=2079) INFO 09-24 20:54:36 [gpu_model_runner.py:3118] Graph capturing finished in 54 secs, took 3.45 GiB
(EngineCore_DP0 pid=1944) INFO 09-24 20:54:36 [core.py:218] init engine (profile, create kv cache, warmup model) took 216.57 seconds
"""  # noqa: E501

#: llama-server b9752 at its default verbosity, verbatim (no context line: the weights and the
#: KV cache are one span)
LLAMACPP_DEFAULT = """\
0.00.100.222 I log_info: verbosity = 3 (adjust with the `-lv N` CLI arg)
0.00.101.818 I srv  llama_server: loading model
0.00.101.889 I common_init_result: fitting params to device memory ...
0.00.930.739 I common_init_from_params: warming up the model with an empty run - please wait ... (--no-warmup to disable)
0.00.976.929 I srv    load_model: initializing slots, n_slots = 4
0.01.002.495 I slot   load_model: id  0 | task -1 | new slot, n_ctx = 4096
0.01.010.233 I srv  llama_server: model loaded
0.01.010.236 I srv  llama_server: server is listening on http://127.0.0.1:18099
"""  # noqa: E501

#: a 35B MoE with a speculative (MTP) draft, verbatim from the excerpt of its log (which starts
#: at the fitting line and ends before the server listened): a context warning splits the
#: load, and the draft's own context line after the warm-up is not the main model's
LLAMACPP_CONTEXT = """\
0.00.831.038 I common_init_result: fitting params to device memory ...
0.00.831.038 I common_init_result: (for bugs during this step try to reproduce them with -fit off, or provide --verbose logs if the bug only occurs with -fit on)
0.05.433.319 W llama_context: n_ctx_seq (184320) < n_ctx_train (262144) -- the full capacity of the model will not be utilized
0.05.679.461 I common_init_from_params: warming up the model with an empty run - please wait ... (--no-warmup to disable)
0.06.128.803 W llama_context: n_ctx_seq (184320) < n_ctx_train (262144) -- the full capacity of the model will not be utilized
0.06.325.920 I srv    load_model: initializing slots, n_slots = 4
0.06.358.838 I common_context_can_seq_rm: the context supports bounded partial sequence removal
"""  # noqa: E501


def test_vllm_parts_of_a_compiled_start_with_cuda_graphs() -> None:
    assert vllm_parts(VLLM_GPU.splitlines()) == {
        "weights": 36.38,  # "Loading weights took", not the model's construction besides
        "compile": 44.45,
        "graph_capture": 5.0,
        # the engine's init holds torch.compile and the capture: the rest is profiling, the
        # KV cache and the warm-up
        "kv_cache": round(113.49 - 44.45 - 5.0, 3),
    }


def test_vllm_parts_of_tensor_parallel_workers_keep_the_slowest() -> None:
    parts = vllm_parts(VLLM_TP8.splitlines())
    assert parts["compile"] == 147.63
    assert parts["kv_cache"] == round(216.57 - 147.63 - 54.0, 3)
    assert "weights" not in parts  # not in these lines: absent, never 0


def test_vllm_parts_of_the_eager_cpu_start_in_the_fixtures() -> None:
    """An eager start compiles and captures nothing: those parts are absent, never 0."""
    log = (FIXTURES / "vllm_logs" / "engine_core_killed.log").read_text().splitlines()
    assert vllm_parts(log) == {"weights": 0.0, "kv_cache": 0.12}


def test_vllm_parts_of_other_releases_wordings() -> None:
    lines = [
        "(EngineCore_DP0 pid=165) INFO 03-18 06:55:50 [gpu_model_runner.py:3659] Model loading "
        "took 4.9054 GiB memory and 44.986674 seconds",
        "INFO 11-03 15:47:45 [model_runner.py:1671] Graph capturing finished in 2 secs, took "
        "0.11 GiB",
        "init engine took 70.62 s (compilation: 42.18 s)",
    ]
    assert vllm_parts(lines) == {
        "weights": 44.987,
        "compile": 42.18,
        "graph_capture": 2.0,
        "kv_cache": round(70.62 - 42.18 - 2.0, 3),
    }
    assert vllm_parts(["Model loading took 14.46 GiB memory"]) == {}  # no seconds stated
    assert vllm_parts([]) == {}


def test_llamacpp_parts_from_its_timestamps() -> None:
    assert llamacpp_parts(LLAMACPP_DEFAULT.splitlines()) == {
        "model_load": round(0.930739 - 0.101818, 3),
        "warmup": round(0.976929 - 0.930739, 3),
        "slots": round(1.010236 - 0.976929, 3),
    }
    assert llamacpp_parts(LLAMACPP_CONTEXT.splitlines()) == {
        "weights": round(5.433319 - 0.831038, 3),
        "kv_cache": round(5.679461 - 5.433319, 3),
        "warmup": round(6.325920 - 5.679461, 3),
        # no "slots": the excerpt ends before the server said it listened
    }


def test_llamacpp_timestamps_count_minutes() -> None:
    """The first field is minutes (``5.09.925.994`` is 5 min 9.926 s; real wording, the
    times made up to span a minute)."""
    lines = [
        "0.58.000.000 I srv    load_model: initializing slots, n_slots = 4",
        "1.02.500.000 I srv  llama_server: server is listening on http://127.0.0.1:8080",
    ]
    assert llamacpp_parts(lines) == {}  # no load start: the slots span needs its own start
    lines.insert(0, "0.01.000.000 I srv  llama_server: loading model")
    assert llamacpp_parts(lines) == {"model_load": 57.0, "slots": 4.5}


def test_llamacpp_parts_of_a_failed_start_state_only_what_was_logged() -> None:
    """The fixture's out-of-memory start loaded its weights (its context's warning came at
    0.489 s) and failed to allocate the KV cache: it never warmed up nor listened, so the
    weights are its only part; none is made up."""
    log = (FIXTURES / "llamacpp" / "oom_kv_cache.log").read_text().splitlines()
    assert llamacpp_parts(log) == {"weights": round(0.489466 - 0.014857, 3)}
    assert llamacpp_parts(["load_model: loading model 'x'", "server is listening on"]) == {}


def _engines() -> list:
    model = ModelSpec(path="m", served_name="m")
    return [
        VllmEngine(EngineSpec(kind="vllm", command=("vllm",)), model),
        LlamaCppEngine(EngineSpec(kind="llamacpp", command=("llama-server",)), model),
        CommandEngine(EngineSpec(kind="command", command=("server", "{port}")), model),
    ]


def test_each_engine_reads_its_own_log_and_a_command_server_states_nothing() -> None:
    vllm, llamacpp, command = _engines()
    assert vllm.startup_parts(VLLM_GPU.splitlines())["graph_capture"] == 5.0
    assert "model_load" in llamacpp.startup_parts(LLAMACPP_DEFAULT.splitlines())
    assert command.startup_parts(VLLM_GPU.splitlines()) == {}


def test_vllm_trials_share_the_studys_compile_cache_unless_the_spec_sets_one(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.delenv(CACHE_ROOT_ENV, raising=False)
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    vllm, llamacpp, command = _engines()
    assert vllm.compile_cache_env(tmp_path) == {
        CACHE_ROOT_ENV: str(tmp_path),
        INDUCTOR_CACHE_ENV: str(tmp_path / "inductor"),
    }
    assert llamacpp.compile_cache_env(tmp_path) == {}
    assert command.compile_cache_env(tmp_path) == {}
    own = VllmEngine(
        EngineSpec(kind="vllm", command=("vllm",), env={CACHE_ROOT_ENV: "/mine"}),
        ModelSpec("m", "m"),
    )
    assert own.compile_cache_env(tmp_path) == {INDUCTOR_CACHE_ENV: str(tmp_path / "inductor")}
    monkeypatch.setenv(CACHE_ROOT_ENV, "/exported")  # the user's shell chose one too
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, "/exported-inductor")
    assert vllm.compile_cache_env(tmp_path) == {}


def test_vllm_launches_name_torchs_default_inductor_cache_outright(tmp_path, monkeypatch) -> None:
    """Each launch has a TMPDIR of its own (server.process), under which torch would put a
    fresh Inductor cache per launch; the launch names torch's default instead, and a study's
    compile cache, the spec's env or the user's environment still win."""
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where torch's default would be
    vllm = _engines()[0]

    def launched(engine: VllmEngine, env: dict[str, str]) -> str | None:
        settings = ServerSettings(flags={}, json_flags={}, env=env)
        launch = engine.build_launch(settings, host="127.0.0.1", port=1, api_key="k")
        return launch.env.get(INDUCTOR_CACHE_ENV)

    default = launched(vllm, {})
    assert default is not None and Path(default).parent == tmp_path
    assert Path(default).name.startswith("torchinductor_")
    study_cache = vllm.compile_cache_env(tmp_path / "study")[INDUCTOR_CACHE_ENV]
    assert launched(vllm, {INDUCTOR_CACHE_ENV: study_cache}) == study_cache
    own = VllmEngine(
        EngineSpec(kind="vllm", command=("vllm",), env={INDUCTOR_CACHE_ENV: "/mine"}),
        ModelSpec("m", "m"),
    )
    assert launched(own, {}) == "/mine"
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, "/exported")  # inherited by the server as it is
    assert launched(vllm, {}) is None


def test_the_phase_clock_adds_up_each_phase() -> None:
    now = [0.0]
    clock = PhaseClock(lambda: now[0])
    clock.start("startup")
    now[0] = 5.0
    clock.start("gate")
    now[0] = 6.5
    clock.start("startup")  # a phase entered again adds up
    now[0] = 7.0
    assert clock.seconds() == {"startup": 5.5, "gate": 1.5}  # the running one up to now
    clock.stop()
    now[0] = 100.0
    assert clock.seconds() == {"startup": 5.5, "gate": 1.5}


def test_the_warm_start_benchmark_explains_itself() -> None:
    """benchmarks/startup_cache.py starts real servers; here only its --help runs."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "startup_cache.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "ABBA" in result.stdout and "--pairs" in result.stdout


def _finished(role: str, time_s: dict | None, parts: dict | None = None, reason: str = ""):
    attrs: dict = {names.ROLE: role}
    if time_s is not None:
        attrs[names.TIME_S] = time_s
    if parts is not None:
        attrs[names.SERVER] = {"startup_parts": parts}
    if reason:
        attrs[names.FAIL_REASON] = reason
    return create_trial(
        state=TrialState.PRUNED if reason else TrialState.COMPLETE,
        value=None if reason else 1.0,
        user_attrs=attrs,
    )


def test_where_the_time_went_adds_the_search_and_keeps_the_confirmation_apart() -> None:
    trials = [
        _finished(
            names.BASELINE,
            {"startup": 30.0, "gate": 2.0, "measurement": 10.0, "teardown": 1.0},
            {"weights": 5.0, "compile": 20.0},
        ),
        _finished(
            names.SEARCH,
            {"startup": 20.0, "gate": 2.0, "measurement": 2.0, "teardown": 1.0},
            {"weights": 5.0},  # a warm start: no compile line
            reason=names.SCREENED,
        ),
        _finished(names.CONFIRM, {"startup": 25.0, "gate": 2.0, "measurement": 10.0}),
        _finished(names.SEARCH, None),  # made before trials recorded their phases
    ]
    spent = time_spent(trials)
    assert spent.phases == {"startup": 50.0, "gate": 4.0, "measurement": 12.0, "teardown": 2.0}
    assert spent.startup_parts == {"weights": 10.0, "compile": 20.0}
    assert spent.confirmation == 37.0
    assert (spent.trials, spent.unrecorded, spent.screened) == (3, 1, 1)
    assert spent.total == 105.0
    lines = spent.lines()
    assert lines[0] == "startup: 50.0 s (48%); of it weights 10.0 s, compile 20.0 s"
    assert "confirmation: 37.0 s (35%)" in lines
    assert lines[-1] == (
        "over 3 trial(s), 1 of them screened after one round; 1 trial(s) without a record"
    )
    assert time_spent([_finished(names.SEARCH, None)]).lines() == []


#: a compiled start that read every graph back from the cache (vLLM 0.32's compilation
#: backend's wording; older releases say "for dynamic shape" where it says "for compile range")
VLLM_WARM = """\
(EngineCore_DP0 pid=811) INFO 12-04 21:40:02 [backends.py:296] Directly load the compiled graph(s) for compile range (1, 2048) from the cache, took 0.512 s
(EngineCore_DP0 pid=811) INFO 12-04 21:40:02 [monitor.py:34] torch.compile takes 3.91 s in total
"""  # noqa: E501
VLLM_AOT = """\
(EngineCore_DP0 pid=812) INFO 12-04 21:41:02 [decorators.py:320] Directly load AOT compilation from path /tmp/c/torch_compile_cache/torch_aot_compile/abc/rank_0_0/model
"""  # noqa: E501
VLLM_PARTLY = (
    VLLM_WARM
    + "(EngineCore_DP0 pid=811) INFO 12-04 21:40:09 [backends.py:399] Compiling a graph for "
    "compile range (2049, 8192) takes 6.10 s\n"
)
#: vLLM 0.32's CPU server (this machine, torch 2.13), compiled, verbatim: a start with an
#: empty VLLM_CACHE_ROOT, then one with the cache that start filled (benchmarks/startup_cache.py)
VLLM_CPU_COLD = """\
(Worker pid=5252) INFO 12-04 21:44:28 [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker pid=5252) INFO 12-04 21:44:48 [decorators.py:743] [backbone] saved AOT compiled function to /tmp/startup-cache-l_ulteyz/cold-0-0/torch_compile_cache/torch_aot_compile/058e17bfdefb48b4a1fa94523ed4e21d9d20d8acc7be25e6634016cad319eb8f/rank_0_0/model
(Worker pid=5252) INFO 12-04 21:44:49 [cpu_model_runner.py:91] Warming up done.
"""  # noqa: E501
VLLM_CPU_LOAD_FAILED = """\
(Worker pid=5454) INFO 12-04 21:45:16 [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker pid=5454) WARNING 12-04 21:45:18 [decorators.py:333] [backbone] Compiling model again due to a load failure from /tmp/startup-cache-l_ulteyz/shared-cache/torch_compile_cache/torch_aot_compile/058e17bfdefb48b4a1fa94523ed4e21d9d20d8acc7be25e6634016cad319eb8f/rank_0_0/model, reason: 'function' object has no attribute 'finalize_loading'
(Worker pid=5454) INFO 12-04 21:45:22 [decorators.py:743] [backbone] saved AOT compiled function to /tmp/startup-cache-l_ulteyz/shared-cache/torch_compile_cache/torch_aot_compile/058e17bfdefb48b4a1fa94523ed4e21d9d20d8acc7be25e6634016cad319eb8f/rank_0_0/model
(Worker pid=5454) INFO 12-04 21:45:23 [cpu_model_runner.py:91] Warming up done.
"""  # noqa: E501


def test_a_start_says_whether_its_graphs_came_from_the_compile_cache() -> None:
    from autotune.engines.vllm.startup import compile_cache, compile_cache_failure

    assert compile_cache(VLLM_GPU.splitlines()) == "cold"  # "for dynamic shape" (0.11)
    assert compile_cache(VLLM_CPU_COLD.splitlines()) == "cold"
    assert compile_cache(VLLM_WARM.splitlines()) == "warm"
    assert compile_cache(VLLM_AOT.splitlines()) == "warm"
    assert compile_cache(VLLM_PARTLY.splitlines()) == "partly warm"
    # an entry was there and could not be read: not "cold" (the start may still save other
    # work), not "warm" (it compiled again), and vLLM's reason is kept
    assert compile_cache(VLLM_CPU_LOAD_FAILED.splitlines()) == "load failed"
    assert compile_cache_failure(VLLM_CPU_LOAD_FAILED.splitlines()) == (
        "'function' object has no attribute 'finalize_loading'"
    )
    assert compile_cache_failure(VLLM_CPU_COLD.splitlines()) is None
    # an eager start, or a log that says nothing of compiling: unknown, not "cold"
    eager = (FIXTURES / "vllm_logs" / "rejected_flag.log").read_text().splitlines()
    assert compile_cache(eager) is None
    assert compile_cache([]) is None
    vllm, llamacpp, command = _engines()
    reading = vllm.compile_cache_state(VLLM_CPU_LOAD_FAILED.splitlines())
    assert (reading.state, reading.load_failure) == (
        "load failed",
        compile_cache_failure(VLLM_CPU_LOAD_FAILED.splitlines()),
    )
    assert vllm.compile_cache_state(VLLM_WARM.splitlines()).load_failure is None
    assert vllm.compile_cache_state(eager) is None
    # llama.cpp has no compile cache; a server autotune does not know says nothing
    assert llamacpp.compile_cache_state(VLLM_WARM.splitlines()) is None
    assert command.compile_cache_state(VLLM_WARM.splitlines()) is None


def _started(role: str, ready: float | None, state: str | None, failure: str | None = None):
    server: dict = {"startup_parts": {}}
    if failure is not None:
        server["compile_cache_failure"] = failure
    if ready is not None:
        server["startup_s"] = ready
    if state is not None:
        server["compile_cache"] = state
    return create_trial(
        state=TrialState.COMPLETE,
        value=1.0,
        user_attrs={
            names.ROLE: role,
            names.TIME_S: {"startup": ready or 1.0},
            names.SERVER: server,
        },
    )


def test_where_the_time_went_says_what_the_compile_cache_saved() -> None:
    trials = [
        _started(names.BASELINE, 64.0, "cold"),
        _started(names.SEARCH, 40.0, "warm"),
        _started(names.SEARCH, 60.0, "cold"),
        _started(names.CONFIRM, 38.0, "warm"),  # the confirmation's starts count too
        _started(names.SEARCH, 30.0, None),  # eager: the log said neither
        _started(names.SEARCH, None, "cold"),  # no time to ready: not counted
    ]
    spent = time_spent(trials)
    assert spent.cache_starts == {"cold": [64.0, 60.0], "warm": [40.0, 38.0]}
    assert spent.lines()[-2] == (
        "compiled starts: 2 cold (median 62.0 s), 2 warm (median 39.0 s); "
        "a warm start took 0.63x a cold one"
    )
    # only cold starts: no ratio is made up
    only_cold = time_spent(trials[:1]).cache_line()
    assert only_cold == "compiled starts: 1 cold (median 64.0 s)"
    # a study whose logs never said: no line at all
    assert not any("compiled starts" in line for line in time_spent(trials[4:5]).lines())
    # a cache vLLM could not read back: each state against the cold starts, and the reason
    broken = time_spent(
        [
            _started(names.BASELINE, 56.0, "cold"),
            _started(names.SEARCH, 34.0, "load failed", "'function' object has no attribute"),
        ]
    ).cache_line()
    assert broken == (
        "compiled starts: 1 cold (median 56.0 s), 1 load failed (median 34.0 s); a load failed "
        "start took 0.61x a cold one; the engine could not read its compile cache back "
        "('function' object has no attribute), so those starts compiled again"
    )


def test_the_report_page_says_where_the_time_went_and_what_the_cache_did() -> None:
    from autotune.report.html import _time_html

    page = _time_html(
        [
            _started(names.BASELINE, 56.0, "cold"),
            _started(names.SEARCH, 34.0, "load failed", "'function' object has no attribute"),
        ]
    )
    assert "<h2>Where the time went</h2>" in page
    assert "compiled starts: 1 cold (median 56.0 s), 1 load failed (median 34.0 s)" in page
    assert "could not read its compile cache back (&#x27;function&#x27; object" in page
    # a study whose logs never said anything of a cache: no such line
    assert "compiled starts" not in _time_html([_started(names.SEARCH, 30.0, None)])

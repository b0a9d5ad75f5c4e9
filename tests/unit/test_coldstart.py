"""The cold-start savings (docs/coldstart.md): each one does what it says, can be switched off, and never
changes an answer. Timings live in bench/coldstart/run.py, not here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.backends.fingerprint import cpu_fingerprint, cpu_flags
from handler.core import manifest as manifest_module
from handler.core.config import Config
from handler.runtime import prefetch
from handler.runtime.invocation import Runtime
from infra.pack.optimize import OPT_DATA, OPT_FILE, OptimizeError, optimize, remove
from tests.conftest import ROOT, portable_copy, write_tiny_onnx

HARD_TEXTS = [
    "A cold start is the time from nothing to the first answer.",
    "naïve café — 東京タワー, emoji 🚀🔥, ÅNGSTRÖM and ﬁ ligatures",
    "x" * 300,
    "",
    "   leading and trailing   \t\n",
]


def run_python(code: str, env: dict[str, str]) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "OPENBLAS_"))}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


# -- BLAS threads ------------------------------------------------------------------------------------------

BLAS_PROBE = """
import json, os
import handler
import numpy
print(json.dumps({"threads": len(os.listdir("/proc/self/task")), "env": os.environ.get("OPENBLAS_NUM_THREADS"),
                  "report": handler.BLAS_THREADS}))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="OpenBLAS starts no worker thread on one CPU")
def test_openblas_is_pinned_before_numpy_loads() -> None:
    ours = json.loads(run_python(BLAS_PROBE, {}))
    off = json.loads(run_python(BLAS_PROBE, {"WARMSTART_BLAS_THREADS": "default"}))
    # The setting reached OpenBLAS in time: no worker thread; with the switch off OpenBLAS starts its own.
    assert ours["threads"] == 1 and ours["env"] == "1"
    assert ours["report"] == {"OPENBLAS_NUM_THREADS": "1", "by": "warmstart", "too_late": False}
    assert off["threads"] > 1 and off["env"] is None and off["report"]["by"] == "off"


def test_an_explicit_openblas_setting_wins() -> None:
    got = json.loads(run_python(BLAS_PROBE, {"OPENBLAS_NUM_THREADS": "2"}))
    assert got["env"] == "2" and got["report"]["by"] == "environment"


def test_numpy_imported_first_is_reported_as_too_late() -> None:
    got = json.loads(run_python("import numpy\n" + BLAS_PROBE, {}))
    assert got["report"]["too_late"] is True


# -- the import chain --------------------------------------------------------------------------------------

DEFERRED = {
    "handler.api.schemas",
    "handler.models.reloader",
    "handler.models.watcher",
    "handler.models.origins",
    "handler.runtime.status",
    "handler.runtime.workers",
    "handler.runtime.snapshot",
    "hashlib",
    "shutil",
    # generation's: an embedding instance never imports the chat templates' engine, the genai engine or JSON
    # constraints (handler.tasks.generate, handler.backends.genai: imported only for a generate model)
    "jinja2",
    "onnxruntime_genai",
    "llguidance",
    "handler.tasks.generate",
    "handler.tasks.chat",
    "handler.backends.genai",
}


def test_single_model_init_imports_no_deferred_module(model_dir: Path) -> None:
    code = (
        f"import json, sys, handler.app\nprint(json.dumps(sorted(m for m in {sorted(DEFERRED)!r} if m in sys.modules)))"
    )
    env = {"WARMSTART_MODEL": str(model_dir), "WARMSTART_BACKEND": "onnx", "WARMSTART_WARMUP": "0"}
    assert json.loads(run_python(code, env)) == []


# A direct invoke's path (init, then the first answer): the compatible APIs, the OIP, media types, admin
# events, pings, response streaming and base64 are HTTP events' or control events' modules, loaded by their
# first use.
LAMBDA_DEFERRED = {
    "handler.api.compat",
    "handler.api.oip",
    "handler.api.media",
    "handler.api.sse",
    "handler.models.admin",
    "handler.runtime.streamed",
    "handler.runtime.control",
    "base64",
    "handler.tasks.oip_io",  # the inference protocol's adapters: made by its first request (handler.api.oip)
    "handler.backends.towers",  # a pack with towers only (image-text)
}


def test_a_direct_invoke_loads_no_http_or_control_module(model_dir: Path) -> None:
    code = (
        "import json, sys, handler.app\n"
        "answer = json.loads(handler.app.lambda_handler({'inputs': ['a cold start']}, None))\n"
        f"loaded = sorted(m for m in {sorted(LAMBDA_DEFERRED)!r} if m in sys.modules)\n"
        "print(json.dumps([len(answer['embeddings']), loaded]))"
    )
    env = {"WARMSTART_MODEL": str(model_dir), "WARMSTART_BACKEND": "onnx", "AWS_LAMBDA_FUNCTION_NAME": "test"}
    assert json.loads(run_python(code, env)) == [1, []]


def test_a_direct_invoke_defines_no_typing_protocol_class(model_dir: Path) -> None:
    # Protocols are mypy's (handler.core.types.Protocol): at run time a plain base, without typing's class machinery.
    code = (
        "import json, sys, handler.app\n"
        "handler.app.lambda_handler({'inputs': ['a cold start']}, None)\n"
        "mods = [(n, m) for n, m in list(sys.modules.items()) if n.startswith('handler')]\n"
        "found = [f'{n}.{k}' for n, m in mods for k, v in vars(m).items()\n"
        "         if isinstance(v, type) and v.__module__ == n and getattr(v, '_is_protocol', False)]\n"
        "print(json.dumps(sorted(found)))"
    )
    env = {"WARMSTART_MODEL": str(model_dir), "WARMSTART_BACKEND": "onnx", "AWS_LAMBDA_FUNCTION_NAME": "test"}
    assert json.loads(run_python(code, env)) == []


def test_a_direct_invoke_subscribes_no_typing_literal(model_dir: Path) -> None:
    # Literal aliases are only annotations: strings at run time (mypy reads them), not typing's subscriptions.
    code = (
        "import json, sys, typing, handler.app\n"
        "handler.app.lambda_handler({'inputs': ['a cold start']}, None)\n"
        "mods = [(n, m) for n, m in list(sys.modules.items()) if n.startswith('handler')]\n"
        "found = [f'{n}.{k}' for n, m in mods for k, v in vars(m).items() if typing.get_origin(v) is typing.Literal]\n"
        "print(json.dumps(sorted(found)))"
    )
    env = {"WARMSTART_MODEL": str(model_dir), "WARMSTART_BACKEND": "onnx", "AWS_LAMBDA_FUNCTION_NAME": "test"}
    assert json.loads(run_python(code, env)) == []


def test_a_start_parses_its_manifest_once(model_dir: Path) -> None:
    # The prefetch reads the manifest before the imports; the load after them takes that parse.
    code = (
        "import json, sys\n"
        "calls = []\n"
        "_loads = json.loads\n"
        "def loads(data, **kw):\n"
        "    calls.append(b'format_version' in (data if isinstance(data, bytes) else data.encode()))\n"
        "    return _loads(data, **kw)\n"
        "json.loads = loads\n"
        "import handler.app\n"
        "print(json.dumps(sum(calls)))"
    )
    env = {"WARMSTART_MODEL": str(model_dir), "WARMSTART_BACKEND": "onnx", "AWS_LAMBDA_FUNCTION_NAME": "test"}
    assert json.loads(run_python(code, env)) == 1


def test_the_early_parse_is_taken_once_and_only_for_the_same_file(model_dir: Path, tmp_path: Path) -> None:
    early = manifest_module.read_early(model_dir / "manifest.json")
    assert manifest_module.load_manifest(model_dir).raw is early
    assert manifest_module.load_manifest(model_dir).raw is not early  # taken once: a later load reads the file
    # The same bytes, rewritten after the early read: another file now (its mtime), so read again.
    for f in model_dir.iterdir():
        (tmp_path / f.name).symlink_to(f)
    (tmp_path / "manifest.json").unlink()
    (tmp_path / "manifest.json").write_bytes((model_dir / "manifest.json").read_bytes())
    early = manifest_module.read_early(tmp_path / "manifest.json")
    os.utime(tmp_path / "manifest.json", ns=(0, 10**9))
    again = manifest_module.load_manifest(tmp_path).raw
    assert again is not early and again == early


def test_http_and_control_events_load_the_deferred_modules(new_runtime: Any) -> None:
    runtime = new_runtime()
    url = {"version": "2.0", "requestContext": {"http": {"method": "POST", "path": "/v1/embeddings"}}}
    body = json.dumps({"input": ["hello"], "encoding_format": "base64"})
    answer = json.loads(runtime.handle({**url, "body": body})["body"])
    assert isinstance(answer["data"][0]["embedding"], str)  # OpenAI's route, base64 vectors
    status, refused, _ = runtime.handle_http(b'{"warmstart": "reload"}')  # the native route (None)
    assert status == 403 and b"direct invokes only" in refused


def test_status_and_admin_events_still_load_what_they_need(new_runtime: Any) -> None:
    runtime = new_runtime()
    assert runtime.handle({"warmstart": "status"})["warmstart"] == "status"
    assert runtime.handle({"warmstart": "models"})["default"] == runtime.manifest.key


# -- prefetch ----------------------------------------------------------------------------------------------


def test_prefetch_plan_reads_libraries_first_then_the_model_in_touch_order(model_dir: Path) -> None:
    files = prefetch.plan({"WARMSTART_MODEL": str(model_dir), "WARMSTART_BACKEND": "onnx"})
    paths = [p for p, _ in files]
    names = [p.name for p in paths]
    first_model = next(i for i, p in enumerate(paths) if p.parent == model_dir)
    assert all(p.parent != model_dir for p in paths[:first_model])  # libraries first
    assert any("openblas" in n for n in names[:first_model]) and any("onnxruntime" in n for n in names)
    assert not any("providers_cuda" in n for n in names)
    assert names[-1] in ("tokenizer.json", "vocab.txt")  # read last by init
    assert all(p.is_file() for p in paths)
    model_only = prefetch.plan({"WARMSTART_MODEL": str(model_dir), "WARMSTART_BACKEND": "onnx"}, libs=False)
    assert all(p.parent == model_dir for p, _ in model_only)


def test_prefetch_finds_the_embedded_default_model_where_init_does() -> None:
    # prefetch cannot import handler.core.config (it runs before any import): its copy of the rule must agree,
    # or a start without WARMSTART_MODEL silently prefetches no model (it did when the modules moved a level down).
    from handler.core.config import DEFAULT_MODEL_DIRS

    expected = next((d for d in DEFAULT_MODEL_DIRS if d.is_dir()), None)
    assert expected is not None, "make setup packs models/default"
    assert prefetch._model_dir({}) == expected
    assert any(p.parent == expected for p, _ in prefetch.plan({"WARMSTART_BACKEND": "onnx"}, libs=False))


def test_prefetch_takes_the_optimized_files_only_when_they_fit_this_cpu(optimized_dir: Path) -> None:
    env = {"WARMSTART_MODEL": str(optimized_dir), "WARMSTART_BACKEND": "onnx"}
    planned = prefetch.plan(env, libs=False)
    assert [p.name for p, _ in planned][:2] == [OPT_FILE, OPT_DATA]
    # Only what a start reads of the data file (the originals, read once at load, and the packed copies), laid
    # out as one span from offset 0 (infra/pack/opt_layout.py); the embedding tables after it are left out.
    layout = manifest_module.load_manifest(optimized_dir).backends["onnx"]["optimized"]["layout"]
    ((offset, length),) = planned[1][1]
    assert offset == 0 and layout["load_bytes"] + layout["run_bytes"] <= length
    assert length + layout["table_bytes"] <= (optimized_dir / OPT_DATA).stat().st_size
    other = copy_model(optimized_dir, optimized_dir.parent / "other-cpu", cpu_features=["sve"])
    env["WARMSTART_MODEL"] = str(other)
    assert [(p.name, r) for p, r in prefetch.plan(env, libs=False)][:2] == [
        ("model.onnx", None),
        ("model.onnx.data", None),
    ]


def test_prefetch_never_fails_init(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch, "_started", None)
    assert prefetch.plan({"WARMSTART_MODEL": "s3://bucket/model"}) == []
    assert prefetch.start({"WARMSTART_PREFETCH": "off"}) is None and prefetch.report() == {"mode": "off"}
    with pytest.raises(FileNotFoundError):
        prefetch.plan({"WARMSTART_MODEL": str(tmp_path)})
    assert prefetch.start({"WARMSTART_MODEL": str(tmp_path)}) is None  # no manifest: init reports it, not us


def test_the_init_report_says_which_savings_were_used(model_dir: Path) -> None:
    env = {"WARMSTART_MODEL": str(model_dir), "WARMSTART_BACKEND": "onnx", "WARMSTART_WARMUP": "0"}
    code = "import handler.app"
    report = json.loads(run_python(code, env))
    cold = report["coldstart"]
    assert cold["blas_threads"]["by"] == "warmstart"
    prefetched = cold["prefetch"]
    assert prefetched["mode"] == "all"
    if "skipped" in prefetched:  # the model was just read: a warm page cache, where nothing is issued
        assert prefetched["mb"] == 0 and prefetched["code"] == "not read (page cache warm)"
    else:
        assert prefetched["files"] > 3 and prefetched["mb"] > 0
    assert "used" in cold["onnx_optimized"] and cold["deferred_imports_loaded"] == []
    off = json.loads(run_python(code, {**env, "WARMSTART_PREFETCH": "off", "WARMSTART_ORT_OPTIMIZED": "0"}))
    assert off["coldstart"]["prefetch"] == {"mode": "off"}
    assert off["coldstart"]["onnx_optimized"]["used"] is False


# -- pre-optimized model with prepacked weights ------------------------------------------------------------


def copy_model(src: Path, dst: Path, **optimized: Any) -> Path:
    """A copy of a packed model (large files symlinked) whose manifest's optimized entry is overridden."""
    dst.mkdir()
    for p in src.iterdir():
        if p.name != "manifest.json" and p.is_file():
            (dst / p.name).symlink_to(p.resolve())
    raw = json.loads((src / "manifest.json").read_text())
    raw["backends"]["onnx"]["optimized"].update(optimized)
    (dst / "manifest.json").write_text(json.dumps(raw))
    return dst


@pytest.fixture(scope="module")
def optimized_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = portable_copy(model_dir, tmp_path_factory.mktemp("optimized") / "model")
    entry = optimize(out)
    assert entry["onnxruntime"] and entry["cpu_features"] == cpu_fingerprint()["cpu_features"]
    return out


def embed(model: Path, **env: str) -> tuple[list[list[float]], dict[str, Any]]:
    runtime = Runtime.start(Config(model_dir=model, backend="onnx", warmup=False), environ=env, emit=None)
    reply = runtime.handle({"inputs": HARD_TEXTS})
    return reply["embeddings"].tolist(), runtime.init_report["coldstart"]["onnx_optimized"]


def test_optimized_model_is_used_and_bit_identical(optimized_dir: Path) -> None:
    fast, used = embed(optimized_dir)
    portable, off = embed(optimized_dir, WARMSTART_ORT_OPTIMIZED="0")
    assert used["used"] is True and off == {"used": False, "reason": "off (WARMSTART_ORT_OPTIMIZED=0)"}
    assert fast == portable  # bit-identical floats, not merely close


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ({"cpu_features": ["avx512f", "amx_tile"]}, "made for another target: cpu_features"),
        ({"onnxruntime": "0.0.1"}, "made for another target: onnxruntime"),
        ({"arch": "aarch64"}, "made for another target: arch"),
        ({"model": "tokenizer.json"}, "load failed"),  # a broken optimized file: the portable model serves
    ],
)
def test_a_mismatch_falls_back_to_the_portable_model_with_a_report_line(
    optimized_dir: Path, tmp_path: Path, override: dict[str, Any], reason: str
) -> None:
    other = copy_model(optimized_dir, tmp_path / "model", **override)
    got, line = embed(other)
    assert line["used"] is False and line["reason"].startswith(reason)
    assert got == embed(optimized_dir, WARMSTART_ORT_OPTIMIZED="0")[0]


def test_optimize_refuses_outputs_that_differ_and_remove_undoes_it(tmp_path: Path, monkeypatch: Any) -> None:
    from handler.core.manifest import load_manifest
    from infra.pack import optimize as module
    from infra.pack import pack_onnx

    write_tiny_onnx(tmp_path / "tiny.onnx")
    packed = pack_onnx(tmp_path / "tiny.onnx", tmp_path / "packed", "tiny", "1")
    entry = optimize(packed)
    assert entry["bit_identical_probes"] == 2 and OPT_FILE in load_manifest(packed).files
    assert remove(packed) and not (packed / OPT_FILE).exists()
    assert OPT_FILE not in load_manifest(packed).files and "optimized" not in load_manifest(packed).backends["onnx"]

    real = np.array_equal
    monkeypatch.setattr(module.np, "array_equal", lambda a, b: False if a.dtype == np.float32 else real(a, b))
    with pytest.raises(OptimizeError, match="differs"):
        optimize(packed)
    assert "optimized" not in load_manifest(packed).backends["onnx"]  # nothing recorded


def test_cpu_flags_reads_x86_and_arm() -> None:
    assert cpu_flags("processor: 0\nflags\t\t: fpu avx2 fma\n") == {"fpu", "avx2", "fma"}
    assert cpu_flags("Features\t: fp asimd sve\n") == {"fp", "asimd", "sve"}
    assert "hypervisor" not in cpu_fingerprint("flags : avx2 hypervisor")["cpu_features"]


def test_requirements_pin_the_same_onnxruntime_for_pack_and_function() -> None:
    def pin(path: Path) -> str:
        return next(
            line.split("==")[1].strip() for line in path.read_text().splitlines() if line.startswith("onnxruntime==")
        )

    assert pin(ROOT / "infra/deploy/requirements-pack.txt") == pin(ROOT / "layers/requirements.txt")


def test_no_copy_left_behind(optimized_dir: Path) -> None:
    assert not [p for p in optimized_dir.iterdir() if p.name.startswith(".optimize-")]
    shutil.rmtree(optimized_dir.parent / "other-cpu", ignore_errors=True)


# -- tokenizer shortcut ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def proved_dir(optimized_dir: Path) -> Path:
    from infra.pack.wordpiece import prove

    entry = prove(optimized_dir)
    assert entry["proof"]["cases"] >= 40
    return optimized_dir


def test_the_tokenizer_shortcut_gives_the_json_tokenizers_ids_on_hard_cases(proved_dir: Path) -> None:
    from handler.core.manifest import load_manifest
    from handler.tasks.tokens import TextEncoder, usable_shortcut
    from infra.pack.wordpiece import HARD_CASES

    manifest = load_manifest(proved_dir)
    vocab, why = usable_shortcut(manifest.root, manifest.tokenizer, manifest.files)
    assert vocab is not None and why == "proved"
    path = manifest.path("tokenizer.json")
    fast = TextEncoder(path, 256, 0, shortcut=(vocab, manifest.tokenizer["shortcut"]["settings"]))
    slow = TextEncoder(path, 256, 0)
    assert fast.coldstart["shortcut"] == "wordpiece" and slow.coldstart["shortcut"] is None
    for batch in [[case] for case in HARD_CASES] + [HARD_CASES]:
        a, b = fast.encode(batch), slow.encode(batch)
        assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()


def test_init_uses_the_shortcut_and_the_switch_turns_it_off(proved_dir: Path) -> None:
    # A fresh process each: in this one, an encoder for the same tokenizer.json may already be shared.
    env = {"WARMSTART_MODEL": str(proved_dir), "WARMSTART_WARMUP": "0"}
    on = json.loads(run_python("import handler.app", env))["coldstart"]["tokenizer"]
    off = json.loads(run_python("import handler.app", {**env, "WARMSTART_TOKENIZER_SHORTCUT": "0"}))
    assert on == {"shortcut": "wordpiece", "vocab": "vocab.txt"}
    assert off["coldstart"]["tokenizer"] == {"shortcut": None, "reason": "off (WARMSTART_TOKENIZER_SHORTCUT=0)"}


def test_a_proof_for_another_tokenizer_file_is_not_used(proved_dir: Path) -> None:
    from handler.core.manifest import load_manifest
    from handler.tasks.tokens import usable_shortcut

    manifest = load_manifest(proved_dir)
    stale = {**manifest.tokenizer, "shortcut": {**manifest.tokenizer["shortcut"], "proof": {"tokenizer_sha256": "0"}}}
    assert usable_shortcut(manifest.root, stale, manifest.files) == (None, "the proof is for another tokenizer.json")
    assert usable_shortcut(manifest.root, {"file": "tokenizer.json"}, manifest.files)[0] is None


def test_the_proof_refuses_a_pipeline_that_is_not_plain_bert(model_dir: Path) -> None:
    from infra.pack.wordpiece import NotPlainBert, bert_settings

    raw = json.loads((model_dir / "tokenizer.json").read_text())
    assert bert_settings(raw)["lowercase"] is True
    for part, value, message in [
        ("normalizer", {"type": "Lowercase"}, "normalizer"),
        ("pre_tokenizer", {"type": "Whitespace"}, "pre-tokenizer"),
        ("post_processor", None, "post-processor"),
    ]:
        with pytest.raises(NotPlainBert, match=message):
            bert_settings({**raw, part: value})
    extra = {"id": 30522, "special": False, "content": "<x>", "normalized": True}
    with pytest.raises(NotPlainBert, match="added token"):
        bert_settings({**raw, "added_tokens": [*raw["added_tokens"], extra]})


def test_the_proof_catches_ids_that_differ(proved_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from infra.pack import wordpiece

    other = copy_model(proved_dir, tmp_path / "model")
    real = wordpiece.bert_settings
    # A shortcut that would not lowercase: the pipeline check passes it, the cases must not.
    monkeypatch.setattr(wordpiece, "bert_settings", lambda raw: {**real(raw), "lowercase": False})
    with pytest.raises(wordpiece.NotPlainBert, match="ids differ"):
        wordpiece.prove(other)


def test_layers_build_optimizes_only_for_the_pinned_onnxruntime(tmp_path: Path) -> None:
    import onnxruntime

    from handler.core.manifest import load_manifest
    from infra.pack import pack_onnx
    from layers.build import optimize_for_layer

    write_tiny_onnx(tmp_path / "tiny.onnx")
    packed = pack_onnx(tmp_path / "tiny.onnx", tmp_path / "packed", "tiny", "1")
    pinned = tmp_path / "requirements.txt"
    pinned.write_text(f"numpy==2.4.6\nonnxruntime=={onnxruntime.__version__}\n")
    assert optimize_for_layer(packed, pinned).startswith("optimize: prepacked for onnxruntime")
    assert "optimized" in load_manifest(packed).backends["onnx"]
    pinned.write_text("onnxruntime==0.0.1\n")
    assert "skipped" in optimize_for_layer(packed, pinned)
    assert "optimized" not in load_manifest(packed).backends["onnx"]  # a stale one is taken out, not shipped


@pytest.mark.parametrize(
    ("manifest", "why"),
    [
        (None, "optimized files ['../README.md', 'model.onnx']; only model.opt.onnx and model.opt.onnx.data"),
        ("[1]", "not a packed model's manifest"),
        ("{not json", "not a packed model's manifest"),
        ("[" * 200_000 + "]" * 200_000, "not a packed model's manifest"),
    ],
    ids=["names-outside", "a-list", "not-json", "deep"],
)
def test_optimize_remove_deletes_only_its_own_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], manifest: str | None, why: str
) -> None:
    """`warmstart optimize --remove` unlinked whatever names the manifest's optimized entry held (a README
    next to the model, the portable model itself) and ended in a traceback on a manifest that is not ours."""
    from infra.cli import main
    from infra.pack import pack_onnx

    write_tiny_onnx(tmp_path / "tiny.onnx")
    packed = pack_onnx(tmp_path / "tiny.onnx", tmp_path / "packed", "tiny", "1")
    (tmp_path / "README.md").write_text("mine\n")
    raw = json.loads((packed / "manifest.json").read_text())
    raw["backends"]["onnx"]["optimized"] = {"files": ["../README.md", "model.onnx"]}
    (packed / "manifest.json").write_text(json.dumps(raw) if manifest is None else manifest)
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    assert main(["optimize", str(packed), "--remove"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"warmstart optimize: {packed}/manifest.json: ") and why in err
    assert len(err.splitlines()) == 1
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before


def _prefetched(graph: Any, tmp_path: Path) -> set[str]:
    """The initializers of `graph` (saved with every tensor as external data) that the prefetch ranges read."""
    import onnx
    from onnx import helper

    from infra.pack.optimize import touched_ranges

    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    onnx.save_model(model, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    spans = touched_ranges(tmp_path / "m.onnx", merge_gap=0)
    loaded = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    where = {
        t.name: {e.key: int(e.value) for e in t.external_data if e.key != "location"} for t in loaded.graph.initializer
    }
    return {name for name, info in where.items() if any(o <= info["offset"] < o + n for o, n in spans)}


def test_prefetch_ranges_leave_out_every_embedding_table(tmp_path: Path) -> None:
    """A Gather's table and a fused EmbedLayerNormalization's word, position and segment tables are looked up a
    few rows at a time: the prefetch ranges leave them out; every other external initializer is read."""
    from onnx import TensorProto, helper, numpy_helper

    tables = {name: np.zeros((64, 256), np.float32) for name in ("gathered", "word", "position", "segment")}
    weights = {
        "gamma": np.ones(256, np.float32),
        "beta": np.zeros(256, np.float32),
        "w": np.ones((256, 256), np.float32),
    }
    nodes = [
        helper.make_node("Gather", ["gathered", "ids"], ["g"]),
        helper.make_node(
            "EmbedLayerNormalization",
            ["ids", "types", "word", "position", "segment", "gamma", "beta"],
            ["e", "mask_index"],
            domain="com.microsoft",
        ),
        helper.make_node("MatMul", ["e", "w"], ["y"]),
    ]
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "s"]) for n in ("ids", "types")]
    graph = helper.make_graph(
        nodes,
        "tables",
        ints,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in {**tables, **weights}.items()],
    )
    read = _prefetched(graph, tmp_path)
    assert read == set(weights)


def test_prefetch_ranges_leave_out_a_block_quantized_table_unless_a_matmul_reads_it(tmp_path: Path) -> None:
    """An 8-bit tied head's pack: the optimized graph's GatherBlockQuantized looks up rows of a table ONNX
    Runtime folded out of the head (155.6 MB on the 0.6B model), so the start does not read it; its scales, and a
    table a MatMulNBits also takes (read whole at load to prepack), are read."""
    from onnx import TensorProto, helper, numpy_helper

    arrays = {
        "folded": np.zeros((64, 256), np.uint8),  # GatherBlockQuantized's data only: left out
        "scales": np.ones((64, 2), np.float32),
        "shared": np.zeros((64, 256), np.uint8),  # also a MatMulNBits' weight: read
        "shared_scales": np.ones((64, 2), np.float32),
        "w": np.ones((256, 256), np.float32),
    }
    attrs = {"bits": 8, "block_size": 128, "gather_axis": 0, "quantize_axis": 1}
    nodes = [
        helper.make_node("GatherBlockQuantized", ["folded", "ids", "scales"], ["g"], domain="com.microsoft", **attrs),
        helper.make_node(
            "GatherBlockQuantized", ["shared", "ids", "shared_scales"], ["h"], domain="com.microsoft", **attrs
        ),
        helper.make_node(
            "MatMulNBits",
            ["x", "shared", "shared_scales"],
            ["logits"],
            domain="com.microsoft",
            K=256,
            N=64,
            bits=8,
            block_size=128,
        ),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tables",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 256]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("g", "h", "logits", "y")],
        [numpy_helper.from_array(v, k) for k, v in arrays.items()],
    )
    read = _prefetched(graph, tmp_path)
    assert read == set(arrays) - {"folded"}

"""image-text: tiny random CLIP, SigLIP and SigLIP2 (NaFlex) directories packed by `pack --from` (two graphs),
served, and compared with transformers' get_text_features / get_image_features (normalized); Infinity's
`/embeddings` over HTTP; batches of texts and images; refusals."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from starlette.testclient import TestClient

from handler.core.errors import InvalidInputError
from handler.http_host.host import Host
from handler.http_host.routes import create_app
from handler.runtime.invocation import Runtime
from handler.runtime.workers import Sizing, WorkerPool
from handler.tasks.pixels import InvalidImageError, to_rgb
from infra.pack.hf_checks import SourceError
from infra.pack.hf_pack import pack_from
from infra.pack.precision import Precision
from infra.pack.quality import QualityError
from tests.conftest import start
from tests.image_models import TEXT_POSITIONS, make_image_text_dir

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "paris"]


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(1)
    return [
        Image.fromarray(rng.integers(0, 256, (40, 33, 3), dtype=np.uint8)),
        Image.fromarray(rng.integers(0, 256, (20, 50, 4), dtype=np.uint8), "RGBA"),
    ]


def _b64(image: Image.Image, fmt: str = "PNG") -> str:
    out = io.BytesIO()
    image.save(out, fmt)
    return base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Runtime]]:
    tmp = tmp_path_factory.mktemp("image-text")
    out = {}
    for kind in ("clip", "siglip"):
        source = make_image_text_dir(tmp, kind)
        packed = pack_from(source, tmp / f"packed-{kind}", backends=["onnx", "torch"])  # task auto → image-text
        out[kind] = (source, start(packed, "onnx"))
    return out


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_vectors_match_transformers(packs: dict[str, tuple[Path, Runtime]], kind: str) -> None:
    import torch
    import transformers

    source, runtime = packs[kind]
    model = transformers.AutoModel.from_pretrained(str(source)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    processor = transformers.AutoImageProcessor.from_pretrained(str(source))
    padding: dict[str, Any] = (
        {"padding": True} if kind == "clip" else {"padding": "max_length", "max_length": TEXT_POSITIONS}
    )
    encoded = tokenizer(TEXTS, return_tensors="pt", **padding)
    feeds = (
        dict(encoded) if kind == "clip" else {"input_ids": encoded["input_ids"]}
    )  # SigLIP: no mask, as its processor
    pixels = processor(images=_images(), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        want_text = _unit(model.get_text_features(**feeds).pooler_output.numpy())
        want_image = _unit(model.get_image_features(pixel_values=pixels).pooler_output.numpy())
    images = {"inputs": [_b64(i) for i in _images()], "modality": "image"}
    for served in (runtime, start(runtime.config.model_dir, "torch")):  # ONNX graphs; torch.export programs
        text = np.asarray(served.task({"inputs": TEXTS})["embeddings"])
        image = np.asarray(served.task(images)["embeddings"])
        text_diff, image_diff = float(np.abs(text - want_text).max()), float(np.abs(image - want_image).max())
        print(f"{kind} {served.task.backend.name}: text vectors max abs diff {text_diff:.3g}, image {image_diff:.3g}")
        assert text_diff < 1e-5 and image_diff < 1e-5
        assert text.shape[1] == image.shape[1]  # one space
    manifest = runtime.manifest.raw
    assert manifest["task"] == "image-text" and set(manifest["backends"]) == {"onnx", "torch"}
    assert set(manifest["towers"]["image"]["backends"]) == {"onnx", "torch"}
    assert manifest["parity"]["image_max_abs_diff"] < 1e-4


@pytest.fixture(scope="module")
def client(packs: dict[str, tuple[Path, Runtime]]) -> Iterator[TestClient]:
    runtime = packs["clip"][1]
    workers = WorkerPool(Sizing(min_workers=1, max_workers=2, max_queue=4), cpus=2)
    with TestClient(create_app(Host(lambda: runtime, workers))) as c:
        yield c


def test_infinity_embeddings_route_takes_images_and_texts(
    client: TestClient, packs: dict[str, tuple[Path, Runtime]]
) -> None:
    runtime = packs["clip"][1]
    image = _images()[0]
    url = f"data:image/jpeg;base64,{_b64(image, 'JPEG')}"
    r = client.post("/embeddings", json={"input": [url], "modality": "image", "model": "any"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and len(body["data"]) == 1
    native = runtime.task({"inputs": [url], "modality": "image"})["embeddings"]
    np.testing.assert_allclose(body["data"][0]["embedding"], native[0], atol=1e-6)
    r = client.post("/embeddings", json={"input": "hello world"})  # modality defaults to text
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == len(native[0])
    r = client.post("/embeddings", json={"input": ["https://example.com/cat.jpg"], "modality": "image"})
    assert r.status_code == 400 and "never fetched" in r.text and "InvalidImageError" in r.text
    r = client.post("/embeddings", json={"input": ["x"], "modality": "audio"})
    assert r.status_code == 400
    info = client.get("/info").json()
    assert info["model_type"]["embedding"]["modalities"] == ["text", "image"]
    paths = client.get("/openapi.json").json()["paths"]
    assert "/embeddings" in paths


def test_texts_and_images_batch_together_each_with_its_own_answer(packs: dict[str, tuple[Path, Runtime]]) -> None:
    task: Any = packs["siglip"][1].task
    images = [_b64(i) for i in _images()]
    requests = [
        {"inputs": [images[0]], "modality": "image"},
        {"inputs": TEXTS[:2]},
        {"inputs": images, "modality": "image", "encoding_format": "base64"},
        {"inputs": TEXTS[2:]},
    ]
    results = task.run_batch([task.prepare(r) for r in requests], 1 << 20)
    for request, got in zip(requests, results, strict=True):
        want = task(request)["embeddings"]
        if request.get("encoding_format") == "base64":
            assert got["embeddings"] == want
        else:
            np.testing.assert_allclose(got["embeddings"], want, atol=1e-6)
    with pytest.raises(InvalidImageError):
        task.prepare({"inputs": ["aGVsbG8="], "modality": "image"})  # base64 of "hello": not an image
    with pytest.raises(InvalidInputError, match="modality"):
        task.prepare({"inputs": ["x"], "modality": "video"})


def test_refusals_are_one_line(tmp_path: Path, packs: dict[str, tuple[Path, Runtime]]) -> None:
    clip = packs["clip"][0]
    refusals = [
        (lambda: pack_from(clip, tmp_path / "a", backends=["onnx", "tensorrt"]), "valid: onnx, torch"),
        (
            lambda: pack_from(clip, tmp_path / "d", backends=["torch"], precision=Precision(quantize="int8")),
            "the torch backend's program runs float32",
        ),
        (lambda: pack_from(clip, tmp_path / "b", precision=Precision(dtype="float16")), "packed float32, or int8"),
    ]
    for call, words in refusals:
        with pytest.raises(SourceError, match=words) as e:
            call()
        assert "\n" not in str(e.value)
    assert not any((tmp_path / n).exists() for n in "abd")


def test_int8_quantizes_both_towers_behind_the_gate(tmp_path: Path, packs: dict[str, tuple[Path, Runtime]]) -> None:
    import onnx

    source, float32 = packs["clip"]
    packed = pack_from(source, tmp_path / "int8", precision=Precision(quantize="int8"))
    for tower in ("text", "image"):  # each tower's graph holds the integer matmuls
        graph = onnx.load(str(packed / tower / "model.onnx"), load_external_data=False)
        assert any(n.op_type == "MatMulIntegerToFloat" for n in graph.graph.node), tower
    runtime = start(packed, "onnx")
    quality = runtime.manifest.raw["precision"]["quality"]
    assert quality["text_tower"]["items"] > 100 and quality["image_tower"]["items"] == 64
    assert quality["figure"] == min(quality["text_tower"]["figure"], quality["image_tower"]["figure"]) >= 0.99
    assert quality["worst_input"].startswith(quality["worst_tower"])
    images = {"inputs": [_b64(i) for i in _images()], "modality": "image"}
    for request in ({"inputs": TEXTS}, images):  # served answers agree with float32's (unit vectors)
        got = np.asarray(runtime.task(request)["embeddings"])
        want = np.asarray(float32.task(request)["embeddings"])
        cosine = float((got * want).sum(axis=1).min())
        assert cosine > 0.99, (request.get("modality"), cosine)
    with pytest.raises(QualityError, match=r"(text|image) tower") as e:
        refused = Precision(quantize="int8-block", min_quality=1.0, calibration=("a photo", "two cats"))
        pack_from(source, tmp_path / "refused", precision=refused)
    assert "nothing was written" in str(e.value) and not (tmp_path / "refused").exists()


def test_text_requests_never_build_the_image_tower(packs: dict[str, tuple[Path, Runtime]]) -> None:
    runtime = start(packs["siglip"][1].config.model_dir, "onnx")  # warm-up included: it is text only
    backend: Any = runtime.task.backend
    runtime.task({"inputs": TEXTS})
    assert backend.describe()["loaded"] == ["main"] and "image" not in backend.parts
    got = runtime.task({"inputs": [_b64(_images()[0])], "modality": "image"})["embeddings"]
    assert backend.describe()["loaded"] == ["main", "image"] and backend.tower_ms["image"] > 0
    want = packs["siglip"][1].task({"inputs": [_b64(_images()[0])], "modality": "image"})["embeddings"]
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.fixture(scope="module")
def siglip2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Runtime]]:
    """A tiny SigLIP2 packed for both backends: its source and one runtime per backend."""
    tmp = tmp_path_factory.mktemp("siglip2")
    source = make_image_text_dir(tmp, "siglip2")
    packed = pack_from(source, tmp / "packed", backends=["onnx", "torch"])
    return source, {backend: start(packed, backend) for backend in ("onnx", "torch")}


def _naflex_pictures() -> list[Image.Image]:
    """Aspect ratios and sizes that give each image its own patch grid (tall, wide, square-ish, tiny)."""
    wide = Image.fromarray(np.random.default_rng(2).integers(0, 256, (12, 100, 3), dtype=np.uint8))
    return [*_images(), Image.fromarray(np.full((90, 9, 3), 200, np.uint8)), wide, Image.new("RGB", (3, 2), "red")]


def test_siglip2_naflex_images_match_transformers(siglip2: tuple[Path, dict[str, Runtime]]) -> None:
    """SigLIP2: each image its own patch grid, the position embeddings resized to it inside the ONNX graph and
    the torch program alike; served vectors against transformers' processor + get_image_features (and the texts
    against get_text_features), on both backends, alone and batched with texts."""
    import torch
    import transformers

    source, runtimes = siglip2
    model = transformers.AutoModel.from_pretrained(str(source)).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(str(source))
    pictures = _naflex_pictures()
    feeds = processor(images=[to_rgb(p) for p in pictures], return_tensors="pt")  # no do_convert_rgb by default
    assert len({tuple(s) for s in feeds["spatial_shapes"].tolist()}) == len(pictures)  # a grid each, one batch
    tokens = transformers.AutoTokenizer.from_pretrained(str(source))(
        TEXTS, return_tensors="pt", padding="max_length", max_length=TEXT_POSITIONS, truncation=True
    )  # Siglip2Tokenizer: lowercased, padded on the left
    with torch.no_grad():
        want = _unit(model.get_image_features(**feeds).pooler_output.numpy())
        want_text = _unit(model.get_text_features(input_ids=tokens["input_ids"]).pooler_output.numpy())
    images = [_b64(p) for p in pictures]
    for backend, runtime in runtimes.items():
        assert runtime.task.backend.name == backend
        text = np.asarray(runtime.task({"inputs": TEXTS})["embeddings"])
        got = np.asarray(runtime.task({"inputs": images, "modality": "image"})["embeddings"])
        text_diff, diff = float(np.abs(text - want_text).max()), float(np.abs(got - want).max())
        print(f"siglip2 {backend}: image vectors max abs diff {diff:.3g}, text {text_diff:.3g}")
        assert diff < 1e-5 and text_diff < 1e-5
        task: Any = runtime.task
        requests = [
            {"inputs": images[:1], "modality": "image"},
            {"inputs": TEXTS},
            {"inputs": images[1:], "modality": "image"},
        ]
        batched = task.run_batch([task.prepare(r) for r in requests], 1 << 20)
        both = np.concatenate([batched[0]["embeddings"], batched[2]["embeddings"]])
        np.testing.assert_allclose(both, want, atol=1e-5)
    manifest = runtimes["onnx"].manifest.raw
    assert [i["name"] for i in manifest["towers"]["image"]["inputs"]] == [
        "pixel_values",
        "pixel_attention_mask",
        "spatial_shapes",
    ]
    assert manifest["image"]["resize"] == "naflex" and manifest["parity"]["image_max_abs_diff"] < 1e-4
    program = manifest["towers"]["image"]["backends"]["torch"]  # the pack's own check: probes of mixed grids
    assert program["architecture"] == "exported-program" and program["max_abs_diff"] < 1e-4
    print(f"siglip2 pack-time: {manifest['parity']}, torch image program {program['max_abs_diff']:.3g}")


def test_siglip2_images_over_http_on_both_backends(siglip2: tuple[Path, dict[str, Runtime]]) -> None:
    """Infinity's `/embeddings` with modality image, each backend behind the HTTP host: the task's answer."""
    answers = {}
    urls = [f"data:image/png;base64,{_b64(p)}" for p in _naflex_pictures()]
    for backend, runtime in siglip2[1].items():
        workers = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=4), cpus=2)
        with TestClient(create_app(Host(lambda runtime=runtime: runtime, workers))) as c:
            r = c.post("/embeddings", json={"input": urls, "modality": "image", "model": "any"})
        assert r.status_code == 200, r.text
        answers[backend] = np.asarray([row["embedding"] for row in r.json()["data"]])
        native = runtime.task({"inputs": urls, "modality": "image"})["embeddings"]
        np.testing.assert_allclose(answers[backend], native, atol=1e-6)
    assert answers["onnx"].shape == (len(urls), siglip2[1]["onnx"].manifest.raw["dimension"])
    np.testing.assert_allclose(answers["onnx"], answers["torch"], atol=1e-5)


def test_siglip2_int8_quantizes_both_towers_behind_the_gate(
    tmp_path: Path, siglip2: tuple[Path, dict[str, Runtime]]
) -> None:
    """NaFlex calibration images (each its own grid) through the image tower's gate; served answers near
    float32's; a threshold the towers cannot meet publishes nothing."""
    import onnx
    import transformers

    from infra.pack.image_int8 import text_feeds
    from infra.pack.image_source import read_image_text

    source, float32 = siglip2[0], siglip2[1]["onnx"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    feeds, order = text_feeds(read_image_text(source), tokenizer, TEXTS)  # calibrated as served: padded left
    served = tokenizer(order, padding="max_length", max_length=TEXT_POSITIONS, truncation=True, return_tensors="np")
    np.testing.assert_array_equal(np.concatenate([f["input_ids"] for f in feeds]), served["input_ids"])
    packed = pack_from(source, tmp_path / "int8", precision=Precision(quantize="int8"))
    graph = onnx.load(str(packed / "image" / "model.onnx"), load_external_data=False)
    assert any(n.op_type == "MatMulIntegerToFloat" for n in graph.graph.node)
    runtime = start(packed, "onnx")
    quality = runtime.manifest.raw["precision"]["quality"]
    assert quality["image_tower"]["items"] == 64 and quality["text_tower"]["items"] > 100
    assert quality["figure"] == min(quality["text_tower"]["figure"], quality["image_tower"]["figure"]) >= 0.99
    print(f"siglip2 int8: min cosine {quality['figure']} ({quality['worst_input']})")
    images = {"inputs": [_b64(p) for p in _naflex_pictures()], "modality": "image"}
    for request in ({"inputs": TEXTS}, images):
        got = np.asarray(runtime.task(request)["embeddings"])
        want = np.asarray(float32.task(request)["embeddings"])
        assert float((got * want).sum(axis=1).min()) > 0.99, request.get("modality")
    with pytest.raises(QualityError, match=r"(text|image) tower") as e:
        refused = Precision(quantize="int8", min_quality=1.0, calibration=("a photo", "two cats"))
        pack_from(source, tmp_path / "refused", precision=refused)
    assert "nothing was written" in str(e.value) and not (tmp_path / "refused").exists()

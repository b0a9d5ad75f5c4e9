"""The quality gate of a generate pack: the packed graph's greedy decoding against transformers' eager model on
the source, on calibration prompts (infra.pack.lm_calibration) rendered with the model's chat template.

Figures: `greedy_agreement` (per prompt, the fraction of the reference's greedy tokens the graph reproduces before
the first divergence; the mean over prompts) is the gate's figure; `top1_agreement` (teacher-forced along the
reference's tokens: how often the graph's next-token argmax equals transformers') is recorded beside it. float32
must be exact (1.0): a float32 graph that diverges computes another model, and the pack is refused.

Default thresholds on the figure (built-in prompts, 16 tokens each). Measured on the tiny random models of
tests/lm_models.py (hidden 64, weights scaled x8: near-ties everywhere, the worst case for quantization):
int8 greedy 0.56-1.0 (top-1 0.91-1.0) over the six families, int4 greedy 0.05-0.49 (top-1 0.39-0.91). A
real checkpoint's next-token margins are wider, so its figures are higher; the defaults refuse a graph whose
answers leave the source's within the first few tokens: int8 0.5 (every tiny family passes), int4 0.25 (lower:
16 levels per block of weights; the tiny models fail it, their tests pass --min-quality explicitly).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infra.pack.quality import QualityError

METRIC = "greedy agreement vs transformers float32 (mean prefix before the first divergence)"
DEFAULT_MIN_QUALITY = {"float32": 1.0, "int8": 0.5, "int4": 0.25}


def prompt_ids(tokenizer: Any, chat_template: str | None, text: str) -> list[int]:
    """The token ids of one calibration prompt: a user turn through the chat template (the template writes any
    bos itself), or the raw text as the tokenizer encodes it when the model has no template."""
    if chat_template is None:
        return list(tokenizer(text)["input_ids"])
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def reference_greedy(model: Any, ids: list[int], new_tokens: int, eos: set[int]) -> list[int]:
    """transformers' greedy continuation (argmax each step, the KV cache reused), ending at an eos id."""
    import torch

    out: list[int] = []
    with torch.no_grad():
        result = model(torch.tensor([ids]), use_cache=True)
        while True:
            token = int(result.logits[0, -1].argmax())
            out.append(token)
            if token in eos or len(out) >= new_tokens:
                return out
            result = model(torch.tensor([[token]]), cache=result.cache, use_cache=True)  # transformers 5's name


def graph_greedy(og: Any, model: Any, ids: list[int], new_tokens: int) -> list[int]:
    """The packed graph's own greedy search (onnxruntime-genai, stopping at the pack's eos ids)."""
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + new_tokens)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    out: list[int] = []
    while len(out) < new_tokens and not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out


def graph_top1(og: Any, model: Any, ids: list[int], reference: list[int]) -> list[bool]:
    """Teacher-forced along `reference`: whether the graph's argmax at each position is the reference's token."""
    import numpy as np

    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + len(reference) + 1)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    agree = []
    for i, token in enumerate(reference):
        logits = np.asarray(generator.get_logits())[0, -1]
        agree.append(int(logits.argmax()) == token)
        if i + 1 < len(reference):
            generator.append_tokens([token])
    return agree


def prefix_fraction(want: list[int], got: list[int]) -> float:
    same = 0
    for a, b in zip(want, got, strict=False):
        if a != b:
            break
        same += 1
    if same == len(want) == len(got):
        return 1.0
    return same / max(len(want), 1)


def measure(source: Any, packed: Path, prompts: list[str], new_tokens: int, eos_ids: list[int]) -> dict[str, Any]:
    """The gate's figures of the graph in `packed` (genai_config.json + model.onnx) against the source."""
    import onnxruntime_genai as og  # type: ignore[import-untyped]  # pack time only
    import torch
    import transformers

    threads = torch.get_num_threads()
    # One torch thread for the gate: with torch's OpenMP team of 2 (this host's cores), a SmolLM2-135M pack hung
    # here, both threads spinning for 18+ minutes (gdb: the main thread in a Linear's mkl_blas_sgemv_omp ->
    # gomp_team_end -> gomp_team_barrier_wait_end, the team's worker back in gomp_thread_start's dock barrier;
    # torch's libgomp the only one loaded, no fork). A team of one never waits at a barrier; the reference is a
    # few hundred single-token steps of the float32 model, small next to the builder.
    torch.set_num_threads(1)
    try:
        return _measure(og, torch, transformers, source, packed, prompts, new_tokens, eos_ids)
    finally:
        torch.set_num_threads(threads)


def _measure(
    og: Any,
    torch: Any,
    transformers: Any,
    source: Any,
    packed: Path,
    prompts: list[str],
    new_tokens: int,
    eos_ids: list[int],
) -> dict[str, Any]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source.root), local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(source.root), local_files_only=True, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    graph = og.Model(str(packed))
    eos = set(eos_ids)
    greedy, top1 = [], []
    for text in prompts:
        ids = prompt_ids(tokenizer, source.chat_template, text)
        want = reference_greedy(model, ids, new_tokens, eos)
        greedy.append(prefix_fraction(want, graph_greedy(og, graph, ids, new_tokens)))
        top1 += graph_top1(og, graph, ids, want)
    del graph, model
    return {
        "metric": METRIC,
        "figure": round(sum(greedy) / len(greedy), 6),
        "greedy_agreement": round(sum(greedy) / len(greedy), 6),
        "top1_agreement": round(sum(top1) / len(top1), 6),
        "items": len(prompts),
        "new_tokens": new_tokens,
    }


def check(figures: dict[str, Any], label: str, min_quality: float | None) -> dict[str, Any]:
    """The figures with the threshold; float32 must be exact. QualityError (nothing written) below it."""
    if label == "float32":
        if figures["figure"] < 1.0 or figures["top1_agreement"] < 1.0:
            raise QualityError(
                f"the float32 graph cannot be proved equal to the source: greedy agreement {figures['figure']}, "
                f"top-1 agreement {figures['top1_agreement']} vs transformers on {figures['items']} prompts; "
                "nothing was written"
            )
        return {**figures, "min_quality": 1.0, "passed": True}
    threshold = DEFAULT_MIN_QUALITY[label] if min_quality is None else float(min_quality)
    if figures["figure"] < threshold:
        raise QualityError(
            f"--quantize {label}: quality {figures['figure']:.6f} ({figures['metric']}) is below --min-quality "
            f"{threshold} (top1_agreement {figures['top1_agreement']}, items {figures['items']}); nothing was "
            "written. Lower --min-quality to accept it, or pack float32"
        )
    return {**figures, "min_quality": threshold, "passed": True}

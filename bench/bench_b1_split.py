"""Where a warm call's time goes, ours vs fastembed, at 1 intra-op thread each, part by part, in one run.

    .venv/bin/python bench/bench_b1_split.py [--rounds 12 --block 20] [--json out.json]

Needs bench/bench_peers.py's peers (build/peers/fastembed, build/peers/onnx-export). Three children, each in its
own interpreter and onnxruntime (bench/b1_split_driver.py): ours on the default pack (models/default), ours on
the optimized pack (build/bench/model-optimized, `warmstart optimize`), fastembed 0.9.1 on optimum's export of
the same weights. The parent alternates them block by block (order reversed every round) so all see the same
machine load; each block times every part at batch 1 and at batch 32 (the driver's 32 short sentences).

Per part the median per call (wall and the calling thread's CPU time), and `whole` over fastembed's `whole`
(the issue's figure: lambda_handler's whole call vs fastembed's embed + tolist, as bench/peers_driver.py does).
`graph-own` vs `graph-peer` (a loop of their own, each run right after the other): the model run alone, graph
for graph, on the same ids, the peer's graph in this side's onnxruntime with the peer's SessionOptions.

`--graphs`: instead, each graph and session setting raw (`session.run` on the same ids, batch 1 and 32), in our
onnxruntime and in fastembed's, the two interpreters interleaved: ours at EXTENDED and ALL, with
`session.set_denormal_as_zero`, the optimized pack, ours with SkipLayerNormalization forced in (the pack's
fusion pass never fuses it: infra/pack/hf_export.py); optimum's export at ALL (fastembed's) and EXTENDED.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.b1_split_driver import MARK  # noqa: E402
from bench.bench_peers import EXPORT, OURS_MODEL, OURS_OPTIMIZED, base_env, variant_process, venv_python  # noqa: E402
from bench.json_child import JsonChild  # noqa: E402
from bench.peers_driver import SENTENCES  # noqa: E402

DRIVER = ROOT / "bench" / "b1_split_driver.py"
VARIANTS = ("ours", "ours-optimized", "fastembed")
CLOCKS = ("wall", "cpu")


HUGETLB = "+hugetlb"  # a variant's suffix: the same, with GLIBC_TUNABLES=glibc.malloc.hugetlb=1
GRAPHS = ("graphs@ours", "graphs@fastembed")  # --graphs: each graph raw, in our onnxruntime and in fastembed's


class Child:
    """One variant's b1_split_driver, its first line (`hello`) read."""

    def __init__(self, variant: str) -> None:
        if variant in GRAPHS:
            here = variant == "graphs@ours"
            python = sys.executable if here else str(venv_python("fastembed"))
            argv = [python, str(DRIVER), "graphs", "--ours-model", str(OURS_MODEL), "--export", str(EXPORT)]
            # The optimized pack's prepacked weights are for our onnxruntime only; the fusion needs our venv's onnx.
            argv += ["--optimized", str(OURS_OPTIMIZED / "model.opt.onnx"), "--skip-layer-norm"] if here else []
            self.child = JsonChild(argv, base_env(), MARK)
            self.hello = self.child.read()
            return
        hugetlb = variant.endswith(HUGETLB)
        python, kind, _, env = variant_process(variant.removesuffix(HUGETLB))
        if hugetlb:  # glibc's malloc asks for transparent huge pages for its mmap'd chunks
            env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1"
        if kind == "ours":
            env["WARMSTART_THREADS"] = "1"
        argv = [python, str(DRIVER), kind, "--ours-model", str(OURS_MODEL), "--export", str(EXPORT)]
        self.child = JsonChild(argv, env, MARK)
        self.hello = self.child.read()

    def ask(self, texts: list[str], calls: int) -> Any:
        return self.child.ask({"texts": texts, "calls": calls})

    def close(self) -> None:
        self.child.close()


def min_cosine(a: list[list[float]], b: list[list[float]]) -> float:
    """The lowest cosine between matching rows of two answers."""
    import math

    def cos(x: list[float], y: list[float]) -> float:
        dot = sum(p * q for p, q in zip(x, y, strict=True))
        return dot / (math.sqrt(sum(p * p for p in x)) * math.sqrt(sum(q * q for q in y)))

    return min(cos(x, y) for x, y in zip(a, b, strict=True))


def measure(variants: tuple[str, ...], rounds: int, block: int) -> dict[str, Any]:
    children = {v: Child(v) for v in variants}
    batches = {"b1": SENTENCES[1:2], "b32": SENTENCES}
    try:
        for c in children.values():  # warm-up block: arenas, caches; not kept
            for texts in batches.values():
                c.ask(texts, 5)
        times: dict[str, Any] = {}
        for r in range(rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for v in order:
                for b, texts in batches.items():
                    got = children[v].ask(texts, block if b == "b1" else max(2, block // 8))
                    for k in CLOCKS:
                        for part, xs in got[k].items():
                            times.setdefault(k, {}).setdefault(b, {}).setdefault(v, {}).setdefault(part, []).extend(xs)
        result: dict[str, Any] = {"onnxruntime": {v: c.hello["onnxruntime"] for v, c in children.items()}}
        vecs = {v: c.hello["vecs"] for v, c in children.items() if "vecs" in c.hello}
        if vecs:
            result["min_cosine_to_fastembed"] = {v: min_cosine(x, vecs["fastembed"]) for v, x in vecs.items()}
        for k, per_b in times.items():
            for b, per_v in per_b.items():
                for v, parts in per_v.items():
                    row = {p: statistics.median(xs) * 1e3 for p, xs in parts.items()}
                    row["n"] = len(next(iter(parts.values())))
                    result.setdefault(k, {}).setdefault(b, {})[v] = row
        return result
    finally:
        for c in children.values():
            c.close()


def table(result: dict[str, Any], variants: tuple[str, ...]) -> str:
    lines = [f"onnxruntime: {result['onnxruntime']}"]
    if "min_cosine_to_fastembed" in result:
        cos = ", ".join(f"{v} {c:.9f}" for v, c in result["min_cosine_to_fastembed"].items())
        lines.append(f"same answers: lowest cosine to fastembed's vectors: {cos}")
    for k in CLOCKS:
        for b in ("b1", "b32"):
            rows = result[k][b]
            parts = list(dict.fromkeys(p for v in variants for p in rows[v] if p != "n"))
            lines.append(f"\n{k} ms, {b} (median; n={rows[variants[0]]['n']} a part)")
            lines.append(f"  {'part':20s}" + "".join(f"{v:>18s}" for v in variants))
            for p in parts:
                cells = "".join(f"{rows[v][p]:18.3f}" if p in rows[v] else f"{'-':>18s}" for v in variants)
                lines.append(f"  {p:20s}{cells}")
            if "fastembed" in rows:
                fe = rows["fastembed"]["whole"]
                ratios = "".join(f"{rows[v]['whole'] / fe:17.3f}x" for v in variants)
                lines.append(f"  {'whole / fe':20s}{ratios}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--block", type=int, default=20, help="batch-1 calls of each part per block (batch 32: 1/8)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--graphs", action="store_true", help="the graphs and session settings raw, in both onnxruntimes")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    variants = GRAPHS if args.graphs else tuple(args.variants.split(","))
    if not args.graphs and "fastembed" not in variants:
        raise SystemExit("--variants must include fastembed (the ratios are over it)")
    result = measure(variants, args.rounds, args.block)
    print(table(result, variants))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

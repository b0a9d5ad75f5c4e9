"""A Lambda start of a genai pack (one generator per request) imports no numpy: nothing on its path computes with
it (the engine calls onnxruntime-genai's C API, the task runs the tokenizer), and numpy's import is ~8 MB of the
process's own memory and its largest import at init (issue 35's peak-RSS target). A JSON-constrained request
still imports it, where it reads the logits; a start of any other backend imports it first, as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fixtures.genai_pack import cached_genai_pack

CODE = """
import json, sys
import handler.app
handler.app.lambda_handler({"prompt": "hello world", "max_tokens": 4, "temperature": 0}, None)
chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0.7, "seed": 1}
handler.app.lambda_handler(chat, None)
# a Function URL's event: the compatible APIs' and the Open Inference Protocol's modules are loaded for it
compat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
event = {"version": "2.0", "rawPath": "/v1/chat/completions", "body": json.dumps(compat), "isBase64Encoded": False,
         "requestContext": {"http": {"method": "POST", "path": "/v1/chat/completions"}, "stage": "$default"}}
answer = json.loads(handler.app.lambda_handler(event, None))
assert answer["statusCode"] == 200, answer
plain = "numpy" in sys.modules
json_row = {"prompt": "x", "max_tokens": 6, "temperature": 0, "response_format": {"type": "json_object"}}
handler.app.lambda_handler(json_row, None)
print(json.dumps([plain, "numpy" in sys.modules]))
"""


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cached_genai_pack(tmp_path_factory.mktemp("genai"), "qwen3", "int4")


def run(code: str, model: Path, **env: str) -> list[bool]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "AWS_"))}
    env = {**base, "WARMSTART_MODEL": str(model), "AWS_LAMBDA_FUNCTION_NAME": "test", **env}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    result: list[bool] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_a_lambda_start_of_a_genai_pack_answers_without_numpy_until_a_json_constraint(pack: Path) -> None:
    assert run(CODE, pack) == [False, True]


def test_a_start_of_another_backend_imports_numpy_first(model_dir: Path) -> None:
    # handler.app imports it from its own frame before the runtime's chain (the frame-chunk reason in handler.app)
    code = "import json, sys\nimport handler.app\nprint(json.dumps(['numpy' in sys.modules]))"
    assert run(code, model_dir, WARMSTART_BACKEND="onnx") == [True]

"""lm-evaluation-harness against `pagedinfer serve` scores as its own `hf` model on the same model directory.

One loglikelihood (multiple-choice) task through `local-completions` (echo
with logprobs) and one generate-until task through `local-completions` and
`local-chat-completions` (with the chat template), on the embedded model,
with the task data in tests/server/lm_eval_tasks; no hub, no network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pagedinfer.contracts.embedded_model import default_model_dir
from pagedinfer.testing.server_process import free_port, wait_process_healthy

RUNNER = Path(__file__).resolve().parents[1] / "support" / "lm_eval_runs.py"
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_lm_eval_scores_equal_its_hf_model(tmp_path):
    model_dir = str(default_model_dir())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "server.log").open("w+")
    serve = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("pagedinfer")),
            "serve",
            "--served-model-name",
            "tiny",
            "--port",
            str(port),
            "--device",
            "cpu",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_process_healthy(url, serve)
        api = f"model=tiny,tokenizer_backend=huggingface,tokenizer={model_dir},max_retries=1,num_concurrent=1"
        runs = [
            {
                "name": "hf",
                "model": "hf",
                "model_args": f"pretrained={model_dir},dtype=float32,device=cpu",
                "tasks": ["pagedinfer_mc", "pagedinfer_gen"],
                "apply_chat_template": False,
            },
            {
                "name": "hf-chat",
                "model": "hf",
                "model_args": f"pretrained={model_dir},dtype=float32,device=cpu",
                "tasks": ["pagedinfer_gen"],
                "apply_chat_template": True,
            },
            {
                "name": "completions",
                "model": "local-completions",
                "model_args": f"{api},base_url={url}/v1/completions,tokenized_requests=True",
                "tasks": ["pagedinfer_mc", "pagedinfer_gen"],
                "apply_chat_template": False,
            },
            {
                "name": "chat",
                "model": "local-chat-completions",
                "model_args": f"model=tiny,base_url={url}/v1/chat/completions,max_retries=1,num_concurrent=1",
                "tasks": ["pagedinfer_gen"],
                "apply_chat_template": True,
            },
        ]
        (tmp_path / "runs.json").write_text(json.dumps(runs))
        env = {**os.environ, **OFFLINE, "HF_HOME": str(tmp_path / "hf"), "OPENAI_API_KEY": "unused"}
        proc = subprocess.run(
            [sys.executable, str(RUNNER), str(tmp_path / "runs.json"), str(tmp_path / "out.json")],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    finally:
        serve.terminate()
        serve.wait(timeout=30)
        log.close()
    out = json.loads((tmp_path / "out.json").read_text())

    hf_mc, api_mc = out["hf"]["pagedinfer_mc"], out["completions"]["pagedinfer_mc"]
    assert api_mc["metrics"]["acc,none"] == hf_mc["metrics"]["acc,none"]
    for hf_doc, api_doc in zip(hf_mc["docs"], api_mc["docs"], strict=True):
        for (hf_ll, hf_greedy), (api_ll, api_greedy) in zip(hf_doc, api_doc, strict=True):
            assert api_ll == pytest.approx(hf_ll, abs=1e-3, rel=1e-4)
            assert api_greedy == hf_greedy

    assert out["completions"]["pagedinfer_gen"]["docs"] == out["hf"]["pagedinfer_gen"]["docs"]
    assert out["chat"]["pagedinfer_gen"]["docs"] == out["hf-chat"]["pagedinfer_gen"]["docs"]
    assert out["completions"]["pagedinfer_gen"]["metrics"] == out["hf"]["pagedinfer_gen"]["metrics"]
    generated = [text for doc in out["hf"]["pagedinfer_gen"]["docs"] for text in doc]
    assert any(text.strip() for text in generated)  # the comparison is not between empty strings

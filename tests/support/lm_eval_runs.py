"""Run lm-evaluation-harness in this process on the local tasks of tests/server/lm_eval_tasks.

Usage: python lm_eval_runs.py RUNS_JSON OUT_JSON. RUNS_JSON is a list of
{"name", "model", "model_args", "tasks", "apply_chat_template"}; OUT_JSON
gets, per run name, each task's metrics and per document its filtered
responses (loglikelihoods for multiple choice, the generated text for
generate-until). The task YAMLs are written next to OUT_JSON with absolute
paths to the data files, so no hub and no network is involved (the caller
sets HF_DATASETS_OFFLINE and HF_HUB_OFFLINE).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parents[1] / "server" / "lm_eval_tasks"

MULTIPLE_CHOICE = """task: pagedinfer_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""

GENERATE_UNTIL = """task: pagedinfer_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: answer
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 16
  do_sample: false
metric_list:
  - metric: exact_match
"""


def write_tasks(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pagedinfer_mc.yaml").write_text(MULTIPLE_CHOICE.format(data=TASKS_DIR / "multiple_choice.jsonl"))
    (directory / "pagedinfer_gen.yaml").write_text(GENERATE_UNTIL.format(data=TASKS_DIR / "generate_until.jsonl"))


def main(runs_path: str, out_path: str) -> None:
    import lm_eval
    from lm_eval.tasks import TaskManager

    task_dir = Path(out_path).parent / "tasks"
    write_tasks(task_dir)
    manager = TaskManager(include_path=str(task_dir))
    results = {}
    for run in json.loads(Path(runs_path).read_text()):
        out = lm_eval.simple_evaluate(
            model=run["model"],
            model_args=run["model_args"],
            tasks=run["tasks"],
            task_manager=manager,
            batch_size=1,
            log_samples=True,
            apply_chat_template=run["apply_chat_template"],
            random_seed=0,
            numpy_random_seed=0,
            torch_random_seed=0,
            fewshot_random_seed=0,
        )
        results[run["name"]] = {
            task: {
                "metrics": {k: v for k, v in out["results"][task].items() if isinstance(v, (int, float))},
                "docs": [s["filtered_resps"] for s in sorted(out["samples"][task], key=lambda s: s["doc_id"])],
            }
            for task in run["tasks"]
        }
    Path(out_path).write_text(json.dumps(results, default=str))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

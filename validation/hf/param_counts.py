"""Prints the exact parameter count of the model each `fixtures/hf/*.json` describes.

Each model is built from its configuration on PyTorch's `meta` device (shapes, no storage,
no weights downloaded) as `transformers` builds it for training (`AutoModelForCausalLM`;
BERT as a two-label `AutoModelForSequenceClassification`), and its parameters are summed
once each (a tied embedding and head count once).

    python validation/hf/param_counts.py            # every fixture
    python validation/hf/param_counts.py gpt2.json  # some

Needs `torch` and `transformers` (versions in `validation/pytorch/requirements.txt`).
"""

import json
import pathlib
import sys

import torch
import transformers

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "hf"


def count(path: pathlib.Path) -> tuple[int, int]:
    raw = json.loads(path.read_text())
    config = transformers.AutoConfig.for_model(**raw)
    with torch.device("meta"):
        if raw["model_type"] == "bert":
            config.num_labels = 2
            model = transformers.AutoModelForSequenceClassification.from_config(config)
        else:
            model = transformers.AutoModelForCausalLM.from_config(config)
    params = list(model.parameters())  # shared tensors appear once
    return sum(p.numel() for p in params), len(params)


def main() -> None:
    names = sys.argv[1:] or sorted(p.name for p in FIXTURES.glob("*.json"))
    print(f"# torch {torch.__version__}, transformers {transformers.__version__}")
    print("| file | parameters | tensors |")
    print("|---|---:|---:|")
    for name in names:
        n, tensors = count(FIXTURES / name)
        print(f"| `{name}` | {n:,} | {tensors} |")


if __name__ == "__main__":
    main()

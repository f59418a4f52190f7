"""One rank of the setup check (finding 7): the training videos are opened by rank 0 only.

Each rank counts the videos it decodes while `PromptDataModule.setup` loads the prompts; every
rank must end with the same samples and load report.
"""

from __future__ import annotations


def run(train_path: str) -> dict:
    import paravt.data.datasets as datasets
    from paravt.data.prompt_datamodule import PromptDataModule

    opened: list[str] = []
    check = datasets.video_problem

    def counting(sample, how):
        if how != "none":
            opened.append(sample.video)
        return check(sample, how)

    datasets.video_problem = counting
    dm = PromptDataModule(train_path, batch_size=2, max_steps=1)
    dm.setup("fit")
    import os
    from pathlib import Path

    path = Path(train_path).with_name("not_json.jsonl")  # rank 0's read fails
    tmp = path.with_suffix(f".{os.environ.get('RANK', '0')}")
    tmp.write_text("{not json\n")
    os.replace(tmp, path)  # both ranks see the file; only rank 0 reads it
    bad = PromptDataModule(str(path), batch_size=2, max_steps=1)
    try:
        bad.setup("fit")
        error = None
    except Exception as exc:  # every rank must get rank 0's error, none may hang
        error = type(exc).__name__
    return {
        "opened": len(opened),
        "ids": [s.id for s in dm.train_samples],
        "report": dm.load_report,
        "error": error,
    }

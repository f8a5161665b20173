"""Evaluation and fine-tuning data sets (vendored under `resources/data/`, see its PROVENANCE.md, or fetched
once from the Hugging Face Hub into a local Parquet file, `fetch_hub`). How their questions are put to the
model is `arithmech.data.formatting`.

Every loader returns a pandas DataFrame with a stable string `id` column (the same file gives the same ids)
and raises `FileNotFoundError` for a missing file and `ValueError`, naming the file, the record and the
expected format, for a malformed one. Record files (JSON, JSON Lines, Parquet) are read with Hugging Face
`datasets`, so a local file and a Hub download go through the same reader and types; the loaders accept the
Hub's column layout of each set (GSM8K's and SVAMP's are those of the vendored files).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from arithmech.data.answers import answer_sentence

DATA_DIR = Path(__file__).resolve().parents[3] / "resources" / "data"

_CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K calculator annotations: "48/2 = <<48/2=24>>24"
_GSM8K_FINAL = re.compile(r"(?:\A|\n)#### (?P<gold>[^\n]+)\s*$")
_CHECKSUM_LINE = re.compile(r"^(?P<digest>[0-9a-f]{64})  (?P<name>\S+)$", re.M)


def _open_text(path: str | Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    data = path.read_bytes()
    check_vendored(path, data)
    return _decode(path, data)


def vendored_checksums(data_dir: Path) -> dict[str, str]:
    """{path relative to `data_dir`: sha256} as `data_dir`/PROVENANCE.md records them (`sha256sum -c` lines)."""
    return {m["name"]: m["digest"] for m in _CHECKSUM_LINE.finditer((data_dir / "PROVENANCE.md").read_text())}


def check_vendored(path: Path, data: bytes | None = None) -> None:
    """If `path` is a vendored file (under DATA_DIR), check its bytes (`data`, else read) against the sha256 that
    DATA_DIR/PROVENANCE.md records for it, the first time the process reads it (a file replaced since, with a
    new inode or change time, is checked again): a file changed, swapped or not recorded stops the job here,
    naming it, instead of changing results silently."""
    data_dir, path = DATA_DIR.resolve(), Path(path).resolve()
    if not path.is_relative_to(data_dir):
        return
    stat = path.stat()
    identity = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if _VENDORED_CHECKED.get(path) == identity:
        return
    record = data_dir / "PROVENANCE.md"
    expected = vendored_checksums(data_dir).get(path.relative_to(data_dir).as_posix())
    if expected is None:
        raise ValueError(f"{path}: a vendored data file with no sha256 in {record}; record it there (see that file) "
                         "or keep your own data outside resources/data")
    actual = hashlib.sha256(data if data is not None else path.read_bytes()).hexdigest()
    if actual != expected:
        raise ValueError(f"{path}: its sha256 is {actual}, but {record} records {expected}: the vendored file was "
                         "changed or replaced; restore it (`git checkout -- resources/data`)")
    _VENDORED_CHECKED[path] = identity


_VENDORED_CHECKED: dict[Path, tuple] = {}  # path -> (inode, size, mtime, ctime) when its checksum was checked


def _decode(path: Path, data: bytes) -> str:
    """`data`, the bytes of `path`, as UTF-8 text; else a ValueError naming the file, the line and the byte (a
    bare UnicodeDecodeError names neither the file nor where in it)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start}, line {line}: {data[err.start:err.end]!r}, "
                         f"{err.reason}); save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)") from None


def _load_json(path: str | Path, expected: str):
    try:
        return json.loads(_open_text(path))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err}); expected {expected}") from None


def _records(path: str | Path, expected: str) -> list[dict]:
    """The records of a local JSON Lines, JSON (a list of objects) or Parquet file, as dicts, read with
    Hugging Face `datasets`. Nothing touches the network (a local file names no Hub repository), and the
    Arrow cache `datasets` writes goes to a temporary folder removed on return (the table is kept in
    memory), not to ~/.cache. A column that some records lack holds None in them."""
    import datasets

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    data = path.read_bytes() if path.suffix != ".parquet" else None
    check_vendored(path, data)
    if data is not None:  # Arrow's JSON reader keeps invalid UTF-8 and fails only when a row is read
        _decode(path, data)
    datasets.disable_progress_bars()  # job logs are files: no progress bars per file read
    reader = datasets.Dataset.from_parquet if path.suffix == ".parquet" else datasets.Dataset.from_json
    with tempfile.TemporaryDirectory(prefix="arithmech-datasets-") as cache:
        try:
            table = reader(str(path), cache_dir=cache, keep_in_memory=True)
        except Exception as err:  # datasets wraps the reader's error; name where the file is broken
            raise ValueError(f"{path}{_unreadable(path, err)}; expected {expected}") from err
    if len(table) == 0:
        raise ValueError(f"{path}: no records; expected {expected}")
    try:
        return table.to_list()
    except UnicodeDecodeError as err:  # a Parquet string column written without checking its bytes
        raise ValueError(f"{path}: a string column is not UTF-8 ({err}); expected {expected}") from None


def _unreadable(path: Path, err: Exception) -> str:
    """Why `datasets` could not read a file, as precisely as the plain parser can say it (datasets reports
    a generic "error while generating the dataset")."""
    if path.suffix == ".parquet":
        return f": not a readable Parquet file ({err.__cause__ or err})"
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        return ": no records"
    if path.suffix == ".jsonl":
        for i, line in enumerate(text.splitlines()):
            try:
                json.loads(line) if line.strip() else None
            except json.JSONDecodeError as bad:
                return f", line {i + 1}: not valid JSON ({bad})"
    try:
        json.loads(text)
    except json.JSONDecodeError as bad:
        return f": not valid JSON ({bad})"
    return f": not a list of records ({err.__cause__ or err})"


def _missing(record: dict, keys: Sequence[str]) -> list[str]:
    return [k for k in keys if record.get(k) is None]


def _parse_number(text: str, where: str) -> float:
    try:
        return float(text.strip().replace(",", ""))
    except ValueError:
        raise ValueError(f"{where}: expected a number, got {text!r}") from None


# ---------------------------------------------------------------------------------------------------
# GSM8K and SVAMP


def gsm8k_solution(answer: str, where: str = "GSM8K answer") -> tuple[str, float]:
    """(solution, gold) from a raw GSM8K answer: the reasoning with the calculator annotations removed and
    the final "#### N" line replaced by "The answer is N.", and N as a number (commas removed)."""
    match = _GSM8K_FINAL.search(answer)
    if match is None:
        raise ValueError(f"{where}: expected the answer's last line to be '#### <number>', got {answer[-60:]!r}")
    final = match["gold"].strip()
    gold = _parse_number(final, where)
    reasoning = _CALCULATOR.sub("", answer[: match.start()]).rstrip()
    solution = f"{reasoning}\n{answer_sentence(final)}" if reasoning else answer_sentence(final)
    return solution, gold


def load_gsm8k(path: str | Path) -> pd.DataFrame:
    """GSM8K: the vendored `train.jsonl` or `test.jsonl` (one JSON object a line) or the Hub's openai/gsm8k
    (config main) as Parquet; both have the columns `question` and `answer`.

    Columns: id ("gsm8k-{file stem}-{record index}"), question, answer (raw), solution (see
    `gsm8k_solution`), gold (float)."""
    path = Path(path)
    expected = "GSM8K records with the strings question and answer (JSON Lines or Parquet)"
    rows = []
    for i, record in enumerate(_records(path, expected)):
        where = f"{path}, record {i}"
        if not isinstance(record.get("question"), str) or not isinstance(record.get("answer"), str):
            raise ValueError(f"{where}: expected an object with keys 'question' and 'answer' (strings)")
        solution, gold = gsm8k_solution(record["answer"], where)
        rows.append(
            {
                "id": f"gsm8k-{path.stem}-{i}",
                "question": record["question"],
                "answer": record["answer"],
                "solution": solution,
                "gold": gold,
            }
        )
    return pd.DataFrame(rows)


SVAMP_KEYS = ("ID", "Body", "Question", "Equation", "Answer", "Type")


def load_svamp(path: str | Path) -> pd.DataFrame:
    """SVAMP: the vendored `SVAMP.json` (a JSON list of objects) or the Hub's ChilleD/SVAMP as Parquet; both
    have ID, Body, Question, Equation, Answer (a number) and Type (other columns are ignored).

    Columns: id (the record's ID, e.g. "chal-1"), question (Body + " " + Question, runs of whitespace made
    one space), equation, gold (float), type. The one record typed "Common-Divison" is normalised to
    "Common-Division", so the four types group cleanly."""
    path = Path(path)
    expected = f"a JSON list (or Parquet table) of SVAMP records with {', '.join(SVAMP_KEYS)}"
    rows = []
    for i, record in enumerate(_records(path, expected)):
        missing = _missing(record, SVAMP_KEYS)
        if missing:
            raise ValueError(f"{path}, record {i}: missing {missing}; expected {expected}")
        rows.append(
            {
                "id": str(record["ID"]),
                "question": " ".join(f"{record['Body']} {record['Question']}".split()),
                "equation": record["Equation"],
                "gold": _parse_number(str(record["Answer"]), f"{path}, record {i} (ID {record['ID']}), Answer"),
                "type": "Common-Division" if record["Type"] == "Common-Divison" else record["Type"],
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------
# BIG-bench, MMLU, CommonsenseQA and WikiText
#
# The BIG-bench task files are read with `json`, not `datasets`: each example's target_scores maps its own
# choice texts to 0/1, which Arrow can only store as one struct column with a field per distinct choice text
# across the file (thousands for social_iqa, choice order lost), and qa_wikidata's target is a string in
# some examples and a list in others, which Arrow's JSON reader rejects.


def _bigbench_examples(path: str | Path, expected: str) -> tuple[str, list]:
    task = _load_json(path, expected)
    if not isinstance(task, dict) or not isinstance(task.get("examples"), list) or not task["examples"]:
        raise ValueError(f"{path}: expected a BIG-bench task, an object whose 'examples' is {expected}")
    name = str(task.get("name") or Path(path).parent.name)
    return name, task["examples"]


def load_bigbench_choice(path: str | Path) -> pd.DataFrame:
    """A multiple-choice BIG-bench task (social_iqa, strategyqa: examples with `input` and `target_scores`,
    choice -> 0/1, exactly one 1).

    Columns: id ("{task name}-{index}"), input, choices (list of str, in the file's order), correct (index
    of the right choice)."""
    expected = "a list of objects with 'input' and 'target_scores' (choice -> 0 or 1, exactly one 1)"
    name, examples = _bigbench_examples(path, expected)
    rows = []
    for i, ex in enumerate(examples):
        scores = ex.get("target_scores") if isinstance(ex, dict) else None
        if not isinstance(scores, dict) or "input" not in ex or len(scores) < 2:
            raise ValueError(f"{path}, example {i}: expected an object with 'input' and at least two target_scores")
        right = [j for j, score in enumerate(scores.values()) if score == 1]
        if len(right) != 1 or any(score not in (0, 1) for score in scores.values()):
            raise ValueError(f"{path}, example {i}: expected exactly one choice scored 1 (others 0), got {scores}")
        rows.append({"id": f"{name}-{i}", "input": ex["input"], "choices": list(scores), "correct": right[0]})
    return pd.DataFrame(rows)


def load_bigbench_generation(path: str | Path) -> pd.DataFrame:
    """A BIG-bench task scored on generated text (qa_wikidata: examples with `input` and `target`, one
    accepted string or a list of them).

    Columns: id ("{task name}-{index}"), input, targets (list of str)."""
    expected_target = "a string or a list of strings"
    name, examples = _bigbench_examples(path, f"a list of objects with 'input' and 'target' ({expected_target})")
    rows = []
    for i, ex in enumerate(examples):
        target = ex.get("target") if isinstance(ex, dict) else None
        targets = [target] if isinstance(target, str) else target
        valid = isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets)
        if not valid or "input" not in ex:
            raise ValueError(f"{path}, example {i}: expected an object with 'input' and 'target' ({expected_target})")
        rows.append({"id": f"{name}-{i}", "input": ex["input"], "targets": targets})
    return pd.DataFrame(rows)


MMLU_KEYS = ("question", "choices", "answer")
COMMONSENSE_QA_KEYS = ("id", "question", "choices", "answerKey")


def load_mmlu(path: str | Path) -> pd.DataFrame:
    """MMLU as the Hub serves it (cais/mmlu, Parquet or JSON Lines): question, subject, choices (list of
    str), answer (index of the right choice).

    Columns: id ("{file stem}-{record index}"), input (the question), choices, correct, subject."""
    path = Path(path)
    expected = f"MMLU records (the Hub's cais/mmlu layout) with {', '.join(MMLU_KEYS)}"
    rows = []
    for i, record in enumerate(_records(path, expected)):
        choices, answer = record.get("choices"), record.get("answer")
        valid = isinstance(choices, list) and len(choices) >= 2 and all(isinstance(c, str) for c in choices)
        if _missing(record, MMLU_KEYS) or not valid or not isinstance(answer, int) or not 0 <= answer < len(choices):
            raise ValueError(f"{path}, record {i}: expected {expected}: a question, at least two choices and the "
                             f"index of the right one")
        rows.append({"id": f"{path.stem}-{i}", "input": record["question"], "choices": choices, "correct": answer,
                     "subject": record.get("subject") or ""})
    return pd.DataFrame(rows)


def load_commonsense_qa(path: str | Path) -> pd.DataFrame:
    """CommonsenseQA as the Hub serves it (tau/commonsense_qa, Parquet or JSON Lines): id, question,
    choices {label: [A..E], text: [...]}, answerKey (the right choice's label; empty in the unlabelled
    test split, so evaluate on validation).

    Columns: id (the record's id), input (the question), choices (the texts, in label order), correct."""
    path = Path(path)
    expected = f"CommonsenseQA records (the Hub's tau/commonsense_qa layout) with {', '.join(COMMONSENSE_QA_KEYS)}"
    rows = []
    for i, record in enumerate(_records(path, expected)):
        choices = record.get("choices") if isinstance(record.get("choices"), dict) else {}
        labels, texts = choices.get("label") or [], choices.get("text") or []
        if _missing(record, COMMONSENSE_QA_KEYS) or len(labels) != len(texts) or len(labels) < 2:
            raise ValueError(f"{path}, record {i}: expected {expected}, choices as {{label: [...], text: [...]}}")
        if record["answerKey"] not in labels:
            raise ValueError(f"{path}, record {i} (id {record['id']}): answerKey {record['answerKey']!r} is not one "
                             f"of the labels {labels} (the test split has no answers)")
        rows.append({"id": str(record["id"]), "input": record["question"], "choices": list(texts),
                     "correct": labels.index(record["answerKey"])})
    return pd.DataFrame(rows)


def load_text(path: str | Path) -> str:
    """A text to score: a plain text file (the vendored WikiText-2 `test.txt`), as is, or a Parquet table
    with a `text` column (the Hub's Salesforce/wikitext, one line a row with its newline), its rows joined.

    A plain file is read directly: `datasets`' text builder would only split it into lines for us to join
    back, and the file's bytes are the text."""
    path = Path(path)
    if path.suffix == ".parquet":
        expected = "a Parquet table with a text column (string, one line a row)"
        records = _records(path, expected)
        if any(not isinstance(r.get("text"), str) for r in records):
            raise ValueError(f"{path}: expected {expected}")
        text = "".join(r["text"] for r in records)
    else:
        text = _open_text(path)
    if not text.strip():
        raise ValueError(f"{path}: empty; expected plain text")
    return text


def fetch_hub(hub: dict, out_path: str | Path, check, lock: str | Path | None = None) -> str | None:
    """Download one split of a Hub data set, `hub` = {path, name (config, optional), split, revision
    (optional, default main)}, into the Parquet file `out_path`, after `check(file)` (the set's loader) has read
    it: a layout the loader does not know fails here, before any job uses the file. The revision is resolved to
    a commit first, checked against the lock file `lock` (`arithmech.hub_lock`; None: no lock kept), downloaded
    by that commit, recorded in the file's provenance (`read_parquet_meta`: hub, revision) and pinned in the
    lock. A `path` that is a local folder in the Hub's layout has no commit (revision None). Returns the commit.
    Written atomically (a temporary file in the same folder, renamed). `datasets`' download cache is a
    temporary folder too."""
    import datasets
    import pyarrow.parquet as pq

    from arithmech import hub_lock
    from arithmech.io import PROVENANCE_KEY, provenance

    commit = None
    if not Path(hub["path"]).is_dir():
        commit = hub_lock.resolve_commit(hub["path"], hub.get("revision"), "dataset")
        hub_lock.check_pinned(lock, "dataset", hub["path"], hub.get("revision"), commit)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as tmp:
        table = datasets.load_dataset(hub["path"], hub.get("name"), split=hub["split"],
                                      revision=commit or hub.get("revision"), cache_dir=os.path.join(tmp, "cache"))
        staged = Path(tmp) / out.name
        arrow = table.with_format("arrow")[:]  # the rows as one Arrow table; its schema keeps datasets' features
        meta = json.dumps(provenance(stage="fetch_dataset", hub=hub, revision=commit), sort_keys=True)
        pq.write_table(arrow.replace_schema_metadata({**(arrow.schema.metadata or {}), PROVENANCE_KEY: meta}),
                       staged)
        check(staged)
        os.replace(staged, out)
    if commit is not None:
        hub_lock.pin(lock, "dataset", hub["path"], hub.get("revision"), commit)
    return commit


def subsample(df: pd.DataFrame, n: int | None, seed: int) -> pd.DataFrame:
    """`n` rows drawn without replacement (seeded), kept in their original order; all rows when `n` is None
    or at least len(df). The index is reset."""
    if n is None or n >= len(df):
        return df.reset_index(drop=True)
    if n < 0:
        raise ValueError(f"subsample: n must be >= 0 or None, got {n}")
    chosen = np.sort(np.random.default_rng(seed).choice(len(df), size=n, replace=False))
    return df.iloc[chosen].reset_index(drop=True)


def few_shot_examples(train: pd.DataFrame, k: int, seed: int) -> list[tuple[str, str]]:
    """k solved examples (question, solution) drawn without replacement from a `load_gsm8k` frame; the same
    k for every evaluated question, so the prompts differ only in the question."""
    if k > len(train):
        raise ValueError(f"few_shot_examples: asked for {k} shots from {len(train)} examples")
    picked = subsample(train, k, seed)
    return list(zip(picked["question"], picked["solution"]))

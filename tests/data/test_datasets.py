"""Tests for arithmech.data.datasets: the vendored files (checksums, record counts), the loaders (read through
Hugging Face `datasets`, equal to a plain JSON parse; the Hub's layouts, built as local files, never fetched)
and their errors on malformed files, seeded subsampling, and the prompt formats shared by evaluation and
fine-tuning."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from arithmech import hub_lock
from arithmech.data import datasets, formatting
from arithmech.io import sha256_file
from arithmech.model.tiny import build_tiny_tokenizer

D = datasets.DATA_DIR


def test_vendored_files_match_their_recorded_checksums():
    block = re.search(r"```\n(.*?)```", (D / "PROVENANCE.md").read_text(), re.S)[1]
    lines = [line.split() for line in block.strip().splitlines()]
    assert len(lines) == 10
    for digest, name in lines:
        assert sha256_file(D / name) == digest, name
    assert datasets.vendored_checksums(D) == {name: digest for digest, name in lines}  # what a run checks against


def test_a_changed_vendored_file_stops_the_first_read(tmp_path, monkeypatch):
    """A copy of resources/data whose SVAMP.json was edited (one answer changed) or that holds a file PROVENANCE.md
    does not record: the loader stops at the first read, naming the file and both checksums; the untouched copy
    reads, and is hashed once per process. Before, only this test file compared the checksums."""
    vendored = tmp_path / "resources" / "data"
    (vendored / "svamp").mkdir(parents=True)
    for name in ("PROVENANCE.md", "svamp/SVAMP.json"):
        (vendored / name).write_bytes((D / name).read_bytes())
    monkeypatch.setattr(datasets, "DATA_DIR", vendored)
    assert len(datasets.load_svamp(vendored / "svamp" / "SVAMP.json")) == 1000
    hashed = []
    monkeypatch.setattr(datasets, "hashlib", SimpleNamespace(sha256=lambda b: hashed.append(1) or hashlib.sha256(b)))
    datasets.load_svamp(vendored / "svamp" / "SVAMP.json")
    assert hashed == []  # checked once per process and file
    text = (vendored / "svamp" / "SVAMP.json").read_text()
    (vendored / "svamp" / "SVAMP.json").write_text(text.replace('"Answer": 8.0', '"Answer": 9.0', 1))
    recorded = datasets.vendored_checksums(vendored)["svamp/SVAMP.json"]
    with pytest.raises(ValueError) as err:
        datasets.load_svamp(vendored / "svamp" / "SVAMP.json")
    assert f"{vendored / 'svamp' / 'SVAMP.json'}: its sha256 is " in str(err.value)
    assert f"records {recorded}: the vendored file was changed or replaced" in str(err.value)
    (vendored / "extra.txt").write_text("some text\n")
    with pytest.raises(ValueError, match="extra.txt: a vendored data file with no sha256 in"):
        datasets.load_text(vendored / "extra.txt")


@pytest.mark.parametrize(
    "loader, path, n",
    [
        (datasets.load_gsm8k, "gsm8k/train.jsonl", 7473),
        (datasets.load_gsm8k, "gsm8k/test.jsonl", 1319),
        (datasets.load_svamp, "svamp/SVAMP.json", 1000),
        (datasets.load_bigbench_choice, "bigbench/social_iqa/task.json", 1954),
        (datasets.load_bigbench_choice, "bigbench/strategyqa/task.json", 2290),
        (datasets.load_bigbench_generation, "bigbench/qa_wikidata/task.json", 20442),
    ],
)
def test_record_counts_and_unique_string_ids(loader, path, n):
    df = loader(D / path)
    assert len(df) == n
    assert df["id"].is_unique and all(isinstance(i, str) for i in df["id"])
    # the same file gives the same ids
    assert df["id"].tolist() == loader(D / path)["id"].tolist()


def test_wikitext_is_the_whole_file():
    text = datasets.load_text(D / "wikitext-2/test.txt")
    assert text.count("\n") == 4358 and text.startswith(" \n = Robert <unk> = \n")


# ---------------------------------------------------------------------------------------------------
# GSM8K and SVAMP


@pytest.fixture(scope="module")
def gsm8k_train():
    return datasets.load_gsm8k(D / "gsm8k/train.jsonl")


def test_gsm8k_solution_and_gold(gsm8k_train):
    first = gsm8k_train.iloc[0]
    assert first["id"] == "gsm8k-train-0"
    assert first["solution"] == (
        "Natalia sold 48/2 = 24 clips in May.\n"
        "Natalia sold 48+24 = 72 clips altogether in April and May.\n"
        "The answer is 72."
    )
    assert first["gold"] == 72.0
    assert not gsm8k_train["solution"].str.contains("<<|>>|####").any()
    assert gsm8k_train["solution"].str.contains(r"\nThe answer is [^\n]+\.$").all()
    # thousands separators in the final answer ("#### 1,080")
    grouped = gsm8k_train[gsm8k_train["answer"].str.contains(r"#### \d{1,3}(?:,\d{3})+$")]
    assert len(grouped) > 50
    for answer, gold in zip(grouped["answer"], grouped["gold"]):
        assert gold == float(answer.rsplit("#### ", 1)[1].replace(",", ""))
    assert datasets.gsm8k_solution("So 1,000 + 2 = <<1000+2=1002>>1,002.\n#### 1,002") == (
        "So 1,000 + 2 = 1,002.\nThe answer is 1,002.",
        1002.0,
    )
    assert datasets.gsm8k_solution("#### -3.5") == ("The answer is -3.5.", -3.5)


def test_svamp_question_gold_and_type():
    df = datasets.load_svamp(D / "svamp/SVAMP.json")
    row = df.iloc[0]
    assert row["id"] == "chal-1"
    assert row["question"] == (
        "Each pack of dvds costs 76 dollars. If there is a discount of 25 dollars on each pack "
        "How much do you have to pay to buy each pack?"
    )
    assert row["equation"] == "( 76.0 - 25.0 )" and row["gold"] == 51.0
    assert not df["question"].str.contains(r"\s\s|^\s|\s$").any()
    # the one misspelt "Common-Divison" is normalised
    assert df["type"].value_counts().to_dict() == {
        "Subtraction": 531,
        "Addition": 195,
        "Common-Division": 166,
        "Multiplication": 108,
    }


def test_bigbench_loaders():
    social = datasets.load_bigbench_choice(D / "bigbench/social_iqa/task.json")
    assert social.iloc[0].to_dict() == {
        "id": "social_iqa-0",
        "input": "Tracy didn't go home that evening and resisted Riley's attacks. "
        "What does Tracy need to do before this? ",
        "choices": ["Make a new plan", "Go home and see Riley", "Find somewhere to go"],
        "correct": 2,
    }
    assert social["choices"].map(len).value_counts().to_dict() == {3: 1950, 2: 4}
    strategy = datasets.load_bigbench_choice(D / "bigbench/strategyqa/task.json")
    assert set(map(tuple, strategy["choices"])) <= {("Yes", "No"), ("No", "Yes")}
    assert strategy["correct"].isin([0, 1]).all()
    qa = datasets.load_bigbench_generation(D / "bigbench/qa_wikidata/task.json")
    assert qa.iloc[0]["targets"] == ["comedy", "parody"]
    assert qa.iloc[1]["targets"] == ["English"]  # a single string target becomes a list


# ---------------------------------------------------------------------------------------------------
# read through `datasets`: the same frames as a plain JSON parse of the vendored files


def test_gsm8k_through_datasets_equals_a_plain_json_parse():
    for name in ("train", "test"):
        path = D / f"gsm8k/{name}.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        expected = pd.DataFrame(
            {
                "id": [f"gsm8k-{name}-{i}" for i in range(len(records))],
                "question": [r["question"] for r in records],
                "answer": [r["answer"] for r in records],
                "solution": [datasets.gsm8k_solution(r["answer"])[0] for r in records],
                "gold": [datasets.gsm8k_solution(r["answer"])[1] for r in records],
            }
        )
        pd.testing.assert_frame_equal(datasets.load_gsm8k(path), expected)


def test_svamp_through_datasets_equals_a_plain_json_parse():
    records = json.loads((D / "svamp/SVAMP.json").read_text())
    expected = pd.DataFrame(
        {
            "id": [r["ID"] for r in records],
            "question": [" ".join(f"{r['Body']} {r['Question']}".split()) for r in records],
            "equation": [r["Equation"] for r in records],
            "gold": [float(r["Answer"]) for r in records],
            "type": [r["Type"].replace("Common-Divison", "Common-Division") for r in records],
        }
    )
    pd.testing.assert_frame_equal(datasets.load_svamp(D / "svamp/SVAMP.json"), expected)


def test_reading_leaves_no_cache_behind(tmp_path, monkeypatch):
    """The Arrow cache `datasets` writes lives in a temporary folder that is gone after the read."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    datasets.load_svamp(D / "svamp/SVAMP.json")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------
# the Hub's layouts (local files with the columns the Hub serves; nothing is downloaded)


def hub_file(tmp_path, name, columns: dict):
    """A Parquet file as `fetch_hub` writes it: a `datasets` table with the Hub's columns."""
    from datasets import Dataset

    path = tmp_path / f"{name}.parquet"
    Dataset.from_dict(columns).to_parquet(str(path))
    return path


def test_gsm8k_and_svamp_in_the_hubs_layout(tmp_path):
    records = [json.loads(line) for line in (D / "gsm8k/test.jsonl").read_text().splitlines()[:5]]
    path = hub_file(tmp_path, "gsm8k", {"question": [r["question"] for r in records],
                                        "answer": [r["answer"] for r in records]})
    hub = datasets.load_gsm8k(path)
    vendored = datasets.load_gsm8k(D / "gsm8k/test.jsonl").head(5)
    assert hub["id"].tolist() == [f"gsm8k-gsm8k-{i}" for i in range(5)]
    pd.testing.assert_frame_equal(hub.drop(columns="id"), vendored.drop(columns="id"))
    # ChilleD/SVAMP: the vendored columns, Answer a float, plus a column the loader ignores
    svamp = json.loads((D / "svamp/SVAMP.json").read_text())[:4]
    columns = {k: [r[k] for r in svamp] for k in ("ID", "Body", "Question", "Equation", "Answer", "Type")}
    columns["Question_concat"] = [f"{r['Body']} {r['Question']}" for r in svamp]
    hub = datasets.load_svamp(hub_file(tmp_path, "svamp", columns))
    pd.testing.assert_frame_equal(hub, datasets.load_svamp(D / "svamp/SVAMP.json").head(4))


def test_mmlu_in_the_hubs_layout(tmp_path):
    path = hub_file(tmp_path, "mmlu", {
        "question": ["What is 2 + 3?", "Which gas do plants absorb?"],
        "subject": ["elementary_mathematics", "biology"],
        "choices": [["4", "5", "6", "7"], ["Oxygen", "Nitrogen", "Carbon dioxide", "Helium"]],
        "answer": [1, 2],
    })
    df = datasets.load_mmlu(path)
    assert df.to_dict("records") == [
        {"id": "mmlu-0", "input": "What is 2 + 3?", "choices": ["4", "5", "6", "7"], "correct": 1,
         "subject": "elementary_mathematics"},
        {"id": "mmlu-1", "input": "Which gas do plants absorb?",
         "choices": ["Oxygen", "Nitrogen", "Carbon dioxide", "Helium"], "correct": 2, "subject": "biology"},
    ]
    assert all(isinstance(c, list) for c in df["choices"])  # as the BIG-bench loader gives them
    bad = hub_file(tmp_path, "bad_mmlu", {"question": ["q"], "choices": [["a", "b"]], "answer": [2]})
    with pytest.raises(ValueError, match=r"bad_mmlu.parquet, record 0: expected MMLU records"):
        datasets.load_mmlu(bad)
    with pytest.raises(ValueError, match=r"record 0: expected MMLU records .* question, choices, answer"):
        datasets.load_mmlu(hub_file(tmp_path, "csqa_as_mmlu", {"question": ["q"], "answerKey": ["A"]}))


def test_commonsense_qa_in_the_hubs_layout(tmp_path):
    columns = {
        "id": ["075e483d21c29a511267ef62bedc0461", "61fe6e879ff18686d7552425a36344c8"],
        "question": ["The sanctions against the school were a punishing blow, and they seemed to what the "
                     "efforts the school had made to change?", "Sammy wanted to go to where the people were. "
                     "Where might he go?"],
        "question_concept": ["punishing", "people"],
        "choices": [{"label": ["A", "B", "C", "D", "E"],
                     "text": ["ignore", "enforce", "authoritarian", "yell at", "avoid"]},
                    {"label": ["A", "B", "C", "D", "E"],
                     "text": ["race track", "populated areas", "the desert", "apartment", "roadblock"]}],
        "answerKey": ["A", "B"],
    }
    df = datasets.load_commonsense_qa(hub_file(tmp_path, "commonsense_qa", columns))
    assert df["id"].tolist() == columns["id"] and df["correct"].tolist() == [0, 1]
    assert df.loc[1, "choices"] == ["race track", "populated areas", "the desert", "apartment", "roadblock"]
    assert df.loc[1, "input"] == columns["question"][1]
    columns["answerKey"] = ["A", ""]  # the test split: no answers
    with pytest.raises(ValueError, match=r"record 1 \(id 61fe6e879ff18686d7552425a36344c8\): answerKey '' is not"):
        datasets.load_commonsense_qa(hub_file(tmp_path, "test_split", columns))


def test_wikitext_in_the_hubs_layout(tmp_path):
    lines = (D / "wikitext-2/test.txt").read_text().splitlines(keepends=True)[:50]
    assert datasets.load_text(hub_file(tmp_path, "wikitext", {"text": lines})) == "".join(lines)
    with pytest.raises(ValueError, match="expected a Parquet table with a text column"):
        datasets.load_text(hub_file(tmp_path, "no_text", {"line": lines}))


def test_hub_layout_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="mmlu.parquet"):
        datasets.load_mmlu(tmp_path / "mmlu.parquet")
    broken = _write(tmp_path, "gsm8k.parquet", "not parquet")
    with pytest.raises(ValueError, match=r"gsm8k.parquet: not a readable Parquet file.*expected GSM8K records"):
        datasets.load_gsm8k(broken)
    no_answer = hub_file(tmp_path, "svamp", {"ID": ["a"], "Body": ["b"], "Question": ["q"], "Equation": ["e"],
                                             "Type": ["Addition"]})
    with pytest.raises(ValueError, match=r"svamp.parquet, record 0: missing \['Answer'\]"):
        datasets.load_svamp(no_answer)


def test_fetch_hub_writes_the_checked_parquet_file_atomically(tmp_path, monkeypatch):
    """`load_dataset` is replaced by a local table (no network): the file is the table, checked by the loader;
    a table the loader rejects leaves no file."""
    from datasets import Dataset  # Hugging Face datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None, revision=None, cache_dir=None):
        calls.append((path, name, split, revision))
        assert Path(cache_dir).parent.parent == tmp_path / "results/data"  # not ~/.cache
        return Dataset.from_dict({"question": ["What is 2 + 3?"], "choices": [["4", "5"]], "answer": [1]})

    monkeypatch.setattr("datasets.load_dataset", fake_load_dataset)
    monkeypatch.setattr(hub_lock, "resolve_commit", lambda repo, revision, kind: "ab" * 20)  # the Hub's answer
    out = tmp_path / "results/data/mmlu.parquet"
    datasets.fetch_hub({"path": "cais/mmlu", "name": "all", "split": "test"}, out, datasets.load_mmlu)
    assert calls == [("cais/mmlu", "all", "test", "ab" * 20)]  # downloaded by the commit it resolved to
    assert datasets.load_mmlu(out)["choices"].tolist() == [["4", "5"]]
    assert sorted(p.name for p in out.parent.iterdir()) == ["mmlu.parquet"]  # no temporary left
    with pytest.raises(ValueError, match="record 0: expected an object with keys 'question' and 'answer'"):
        datasets.fetch_hub({"path": "cais/mmlu", "split": "test"}, tmp_path / "results/data/gsm8k.parquet",
                           datasets.load_gsm8k)
    assert sorted(p.name for p in out.parent.iterdir()) == ["mmlu.parquet"]


# ---------------------------------------------------------------------------------------------------
# errors on malformed files


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        datasets.load_gsm8k(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"question": "q", "answer": "a\\n#### 3"}\n{"question": "q"\n', r"line 2: not valid JSON"),
        ('{"question": "q", "answer": "no final line"}\n', r"record 0: expected the answer's last line to be '#### "),
        ('{"question": "q", "answer": "a\\n#### 1"}\n{"question": "q", "answer": "a\\n#### three"}\n',
         r"record 1: expected a number, got 'three'"),
        ('{"q": "q", "answer": "a"}\n', r"record 0: expected an object with keys 'question' and 'answer'"),
        ('{"question": "q", "answer": 3}\n', r"record 0: expected an object with keys 'question' and 'answer'"),
        ("\n", r"no records"),
    ],
)
def test_gsm8k_errors(tmp_path, text, message):
    path = _write(tmp_path, "bad.jsonl", text)
    with pytest.raises(ValueError, match=message) as err:
        datasets.load_gsm8k(path)
    assert str(path) in str(err.value)


def test_svamp_errors(tmp_path):
    good = {
        "ID": "x-1",
        "Body": "A has 2.",
        "Question": "How many?",
        "Equation": "2",
        "Answer": 2.0,
        "Type": "Addition",
    }
    bad = {k: v for k, v in good.items() if k != "Answer"}
    path = _write(tmp_path, "SVAMP.json", json.dumps([good, bad]))
    with pytest.raises(ValueError, match=r"SVAMP.json, record 1: missing \['Answer'\]"):
        datasets.load_svamp(path)
    with pytest.raises(ValueError, match="not valid JSON"):
        datasets.load_svamp(_write(tmp_path, "broken.json", "[{"))
    with pytest.raises(ValueError, match="expected a JSON list"):
        datasets.load_svamp(_write(tmp_path, "dict.json", "{}"))


def test_bigbench_errors(tmp_path):
    def task(examples):
        return _write(tmp_path, "task.json", json.dumps({"name": "t", "examples": examples}))

    two_right = task(
        [{"input": "a", "target_scores": {"x": 1, "y": 0}}, {"input": "b", "target_scores": {"x": 1, "y": 1}}]
    )
    with pytest.raises(ValueError, match=r"task.json, example 1: expected exactly one choice scored 1"):
        datasets.load_bigbench_choice(two_right)
    with pytest.raises(ValueError, match=r"example 0: expected an object with 'input' and at least two"):
        datasets.load_bigbench_choice(task([{"input": "a", "target_scores": {"x": 1}}]))
    with pytest.raises(ValueError, match=r"example 0: expected .*'target' \(a string or a list of strings\)"):
        datasets.load_bigbench_generation(task([{"input": "a", "target": 3}]))
    with pytest.raises(ValueError, match="expected a BIG-bench task"):
        datasets.load_bigbench_generation(_write(tmp_path, "list.json", "[]"))
    with pytest.raises(ValueError, match="empty"):
        datasets.load_text(_write(tmp_path, "empty.txt", "\n \n"))


@pytest.mark.parametrize("name, loader", [("train.jsonl", datasets.load_gsm8k), ("SVAMP.json", datasets.load_svamp),
                                          ("task.json", datasets.load_bigbench_generation),
                                          ("test.txt", datasets.load_text)])
def test_a_latin1_file_is_named(tmp_path, name, loader):
    """A data file saved as Latin-1 (the 'e' of 'Cafe' one byte, 0xe9): the error names the file, the line and the
    byte and says to save it as UTF-8; before, a bare UnicodeDecodeError named no file."""
    record = {"question": "Q", "answer": "A\n#### 3", "ID": "x", "Body": "B", "Equation": "1", "Answer": 3,
              "Type": "Addition", "input": "i", "target": "t", "Question": "Q"}
    text = {".jsonl": json.dumps(record) + "\n", ".json": json.dumps([record]),
            ".txt": "line one\n"}[Path(name).suffix]
    if name == "task.json":
        text = json.dumps({"name": "t", "examples": [record]})
    path = tmp_path / name
    path.write_bytes(("\n" + text).replace("line one", "Caf\u00e9").replace('"Q"', '"Caf\u00e9"', 1)
                     .encode("latin-1"))
    with pytest.raises(ValueError) as err:
        loader(path)
    assert f"{path}: not UTF-8 text (byte " in str(err.value) and "line 2" in str(err.value)
    assert "save it as UTF-8" in str(err.value)


# ---------------------------------------------------------------------------------------------------
# subsampling and prompts


def test_subsample():
    df = pd.DataFrame({"id": [str(i) for i in range(20)]}, index=range(100, 120))
    assert datasets.subsample(df, None, 0)["id"].tolist() == df["id"].tolist()
    assert datasets.subsample(df, 50, 0)["id"].tolist() == df["id"].tolist()
    a, b, c = (datasets.subsample(df, 5, s)["id"].tolist() for s in (0, 0, 1))
    assert a == b != c and len(set(a)) == 5
    assert a == sorted(a, key=int)  # original order kept
    assert list(datasets.subsample(df, 5, 0).index) == list(range(5))


def test_plain_math_prompt_and_target(gsm8k_train):
    shots = datasets.few_shot_examples(gsm8k_train, 2, seed=3)
    assert shots == datasets.few_shot_examples(gsm8k_train, 2, seed=3)
    assert shots != datasets.few_shot_examples(gsm8k_train, 2, seed=4)
    (q1, s1), (q2, s2) = shots
    prompt = formatting.math_prompt("How many?", shots)
    assert prompt == f"Question: {q1}\nAnswer: {s1}\n\nQuestion: {q2}\nAnswer: {s2}\n\nQuestion: How many?\nAnswer:"
    assert formatting.math_example("How many?", "2 + 2 = 4.\nThe answer is 4.", shots) == (
        prompt,
        " 2 + 2 = 4.\nThe answer is 4.",
    )
    assert formatting.math_prompt("How many?") == "Question: How many?\nAnswer:"
    frame = formatting.math_prompts(gsm8k_train.head(3), shots)
    assert frame["prompt"].tolist() == [formatting.math_prompt(q, shots) for q in gsm8k_train.head(3)["question"]]
    assert frame["target"].tolist() == [" " + s for s in gsm8k_train.head(3)["solution"]]
    svamp = formatting.math_prompts(pd.DataFrame({"id": ["s"], "question": ["Q?"], "gold": [1.0]}))
    assert "target" not in svamp and svamp["prompt"].tolist() == ["Question: Q?\nAnswer:"]


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_chat_math_prompt_and_target():
    tok = build_tiny_tokenizer()
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        formatting.math_prompt("Q?", style="chat", tokenizer=tok)
    with pytest.raises(ValueError, match="unknown prompt style 'fancy'"):
        formatting.math_prompt("Q?", style="fancy")
    tok.chat_template = CHATML
    shots = [("1+1?", "The answer is 2.")]
    prompt, target = formatting.math_example("2+2?", "The answer is 4.", shots, "chat", tok)
    assert (
        prompt
        == formatting.math_prompt("2+2?", shots, "chat", tok)
        == (
            "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\nThe answer is 2.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
        )
    )
    assert target == "The answer is 4.<|im_end|>\n"


def test_loaders_never_open_a_connection(tmp_path, monkeypatch):
    """Local files only: with every socket connection refused, the `datasets`-backed loaders still read."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError("a loader tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    assert len(datasets.load_gsm8k(D / "gsm8k/test.jsonl")) == 1319
    assert len(datasets.load_svamp(D / "svamp/SVAMP.json")) == 1000
    path = hub_file(tmp_path, "mmlu", {"question": ["q"], "choices": [["a", "b"]], "answer": [0]})
    assert datasets.load_mmlu(path)["correct"].tolist() == [0]


def test_one_question_answer_format():
    """qa_prompt writes the format every user shares: math prompts, choice contexts, few-shot answers."""
    shots = [("a?", "1"), ("b?", "2")]
    assert formatting.qa_prompt("Q?", shots) == ("Question: a?\nAnswer: 1\n\nQuestion: b?\nAnswer: 2\n\n"
                                                 "Question: Q?\nAnswer:")
    assert formatting.math_prompt("Q?", shots) == formatting.qa_prompt("Q?", shots)
    assert formatting.choice_prompt("  Is it?\n") == "Question: Is it?\nAnswer:"
    completion = formatting.qa_prompt("The capital of X is", [("The capital of Y is", "Z")], "", "", "\n")
    assert completion == "The capital of Y is Z\nThe capital of X is"
    assert (formatting.question_prompts(["a?", "Q?"], ["1", "2"], 1, seed=0, items=[1])
            == [formatting.qa_prompt("Q?", [("a?", "1")])])

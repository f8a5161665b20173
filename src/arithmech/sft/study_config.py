"""The precise-SFT study's formats and run names, read from its config section (module docstring of
`arithmech.sft.design`). Standard library only: the Snakefile reads them while Snakemake parses the workflow,
and the config checks (`arithmech.config`) too, so that a Snakemake without the project's packages parses it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from arithmech.sft.methods import DRAWN_METHODS

AUTO = "auto"  # study.train_format: the format is chosen by measurement (rule study_format)
STUDY_TASKS = ("addition", "subtraction", "multiplication", "division")
RUN_NAME = re.compile(r"(lr|seed|draw)(\d+)")
MAX_PAIRS = 1_000_000  # operand pairs of one format: three digits by three (810,000) fit


@dataclass(frozen=True)
class Format:
    """One item format. Operands: a in a_range, b in b_range (inclusive); subtraction keeps a >= b (answers
    are non-negative); division reads a_range as the QUOTIENT range and b_range as the divisor's, so the
    item is (q * b) / b and every answer is exact."""

    name: str
    task: str
    template: str
    operator: str
    a_range: tuple[int, int]
    b_range: tuple[int, int]

    @classmethod
    def from_config(cls, name: str, cfg: dict, section: str = "study.formats") -> Format:
        where = f"config key '{section}.{name}'"
        if cfg.get("task") not in STUDY_TASKS:
            raise ValueError(f"{where}.task: expected one of {list(STUDY_TASKS)}, got {cfg.get('task')!r}")
        for key in ("a", "b"):
            r = cfg.get(key)
            if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) for x in r) and 0 <= r[0] <= r[1]):
                raise ValueError(f"{where}.{key}: expected [low, high] integers with 0 <= low <= high, got {r!r}")
        if cfg["task"] == "division" and cfg["b"][0] < 1:
            raise ValueError(f"{where}.b: a divisor range must start at 1 or more, got {cfg['b']!r}")
        for field in ("{a}", "{op}", "{b}"):
            if field not in cfg.get("template", ""):
                raise ValueError(f"{where}.template: must contain {field}, got {cfg.get('template')!r}")
        count = (cfg["a"][1] - cfg["a"][0] + 1) * (cfg["b"][1] - cfg["b"][0] + 1)
        if count > MAX_PAIRS:
            raise ValueError(f"{where}: {count:,} operand pairs, more than the {MAX_PAIRS:,} a format may have "
                             "(the study lists and shuffles them all); narrow a or b")
        return cls(name, cfg["task"], cfg["template"], str(cfg["operator"]), tuple(cfg["a"]), tuple(cfg["b"]))

    def pairs(self) -> list[tuple[int, int]]:
        """Every operand pair (a, b) of the format, in a fixed order."""
        (a0, a1), (b0, b1) = self.a_range, self.b_range
        if self.task == "division":
            return [(q * b, b) for q in range(a0, a1 + 1) for b in range(b0, b1 + 1)]
        out = [(a, b) for a in range(a0, a1 + 1) for b in range(b0, b1 + 1)]
        return [(a, b) for a, b in out if a >= b] if self.task == "subtraction" else out

    def line(self, a: int, b: int) -> str:
        from arithmech.data.arithmetic import render

        return render(self.template, a=a, op=self.operator, b=b).text


def parse_formats(study: dict) -> dict[str, Format]:
    formats = {name: Format.from_config(name, cfg) for name, cfg in study["formats"].items()}
    if study["train_format"] not in formats:
        raise ValueError(f"config key 'study.train_format': {study['train_format']!r} is not one of study.formats "
                         f"({', '.join(formats)})")
    return formats


def candidate_formats(study: dict) -> dict[str, Format]:
    """The candidates rule study_format measures (`study.format_choice.candidates`), in the config's order."""
    return {name: Format.from_config(name, cfg, "study.format_choice.candidates")
            for name, cfg in study["format_choice"]["candidates"].items()}


def measured_formats(study: dict) -> dict[str, Format]:
    """What rule study_format measures: with `train_format: auto` every candidate, in the config's order;
    with a named format only that one (its measurement is recorded, nothing is chosen)."""
    name = study["train_format"]
    if name == AUTO:
        return candidate_formats(study)
    if name in study["formats"]:
        return {name: Format.from_config(name, study["formats"][name])}
    return {name: candidate_formats(study)[name]}


def study_formats(study: dict, train_format: str | None) -> dict[str, dict]:
    """The study's formats (config dicts) when `train_format` is trained: `study.formats`, plus the trained
    format's definition from the candidates when it is not one of them (None: `study.formats` alone)."""
    formats = dict(study["formats"])
    if train_format is not None and train_format not in formats:
        formats[train_format] = study["format_choice"]["candidates"][train_format]
    return formats


# ---------------------------------------------------------------------------------------------------
# Runs (results/{model}/finetune/study/runs/{arm}/{run})


def parse_run(run: str) -> tuple[str, int]:
    m = RUN_NAME.fullmatch(run)
    if m is None:
        raise ValueError(f"run name {run!r}: expected lr<i>, seed<s> or draw<d>")
    return m[1], int(m[2])


def final_runs(arm: str, study: dict) -> list[str]:
    """The runs of `arm` scored on the test sets: the chosen grid run, more seeds, more draws."""
    runs = ["chosen"]
    runs += [f"seed{s}" for s in range(1, study["seeds"].get(arm, 1))]
    if arm in DRAWN_METHODS:
        runs += [f"draw{d}" for d in range(1, study["random_draws"])]
    return runs


def grid_runs(arm: str, study: dict) -> list[str]:
    return [f"lr{i}" for i in range(len(study["lr_grid"][arm]))]


def choice_path(table) -> Path:
    """Where rule study_format writes its choice, next to its table: formats.parquet -> formats.choice.json."""
    table = Path(table)
    return table.with_name(f"{table.stem}.choice.json")


def read_choice(table) -> dict:
    """The choice rule study_format recorded next to its table `table` (`design.choose_format`; also in the
    table's metadata). JSON, so that the workflow reads it with the standard library while it plans the
    study's jobs (`study.train_format: auto`)."""
    return json.loads(choice_path(table).read_text())

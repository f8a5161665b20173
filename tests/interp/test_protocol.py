"""arithmech.interp.protocol: the teacher-forced protocol's names have one home, importable without torch (the
scorecard and make docs read its tables on machines that need no model); faithfulness with its intervals, the key
circuit against random ones, values pooled over operators."""

import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from arithmech.interp import protocol
from arithmech.interp.nodes import CircuitSet
from helpers import ROOT


def test_the_protocol_names_import_without_torch():
    code = "import sys, arithmech.interp.protocol, arithmech.report.claims.registry; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_no_module_spells_the_ablation_kinds_itself():
    spelled = re.compile(r"""\(\s*["']resample["']\s*,\s*["']mean["']\s*\)|\(\s*["']mean["']\s*,\s*["']resample["']""")
    assert spelled.search(repr(protocol.KINDS))  # positive control: the search finds the tuple as written
    files = [p for p in sorted((ROOT / "src/arithmech").rglob("*.py")) if p.name != "protocol.py"]
    files += sorted((ROOT / "workflow/scripts").glob("*.py"))
    found = [str(p.relative_to(ROOT)) for p in files if spelled.search(p.read_text())]
    assert not found, f"the ablation kinds spelled outside arithmech.interp.protocol: {found}"


def test_the_transfers_sets_are_each_operator_then_each_format_then_svamp_and_non_math():
    """One list for rule transfer (tests/stages/test_stages.py checks its table's targets follow it) and the plan."""
    from arithmech.data.arithmetic import FORMATS

    sets = protocol.transfer_sets(["addition", "division"])
    assert sets[:2] == [("operator", "addition"), ("operator", "division")]
    assert sets[2:-2] == [(fmt, task) for fmt in FORMATS for task in ("addition", "division")]
    assert sets[-2:] == [("svamp", None), ("non_math", None)]


def test_faithfulness_is_elementwise_and_undefined_where_the_model_and_the_empty_circuit_agree():
    np.testing.assert_allclose(protocol.faithfulness([0.5, 2.0, 3.0], 2.0, 0.0), [0.25, 1.0, 1.5])
    means = np.array([[1.0, 0.0, 0.5], [3.0, 3.0, 3.0]])  # per measure: the model, the empty circuit, a circuit
    f = protocol.faithfulness(means, means[:, [0]], means[:, [1]])
    np.testing.assert_allclose(f[0], [1.0, 0.0, 0.5])
    assert np.isnan(f[1]).all()


N_LAYERS, N_HEADS = 4, 6
RANKED = [(l, h) for h in reversed(range(N_HEADS)) for l in reversed(range(N_LAYERS))]  # L3H5 L2H5 ... L0H0
KEY = RANKED[:3]


def _sets():
    """The model, the empty circuit and the key heads with the key MLPs and with every MLP."""
    every = tuple(range(N_LAYERS))
    return [CircuitSet("model", "all", len(RANKED), -1, tuple(RANKED), every),
            CircuitSet("empty", "none", 0, -1, (), ()),
            CircuitSet("key", "key", len(KEY), -1, tuple(KEY), (2, 3)),
            CircuitSet("key", "all", len(KEY), -1, tuple(KEY), every)]


def test_faithfulness_table_and_intervals():
    sets = _sets()
    rng = np.random.default_rng(0)
    n = 40
    model, empty = np.ones(n), np.zeros(n)
    half = (np.arange(n) % 2).astype(float)  # keeps half of the behaviour
    values = {"full": np.stack([model, empty, half, model]),
              "logit": np.stack([30 + rng.random(n), 20 + rng.random(n), 25 + rng.random(n), 20 + rng.random(n)])}
    clusters = np.arange(n) // 2  # two items per operand pair
    table = protocol.faithfulness_table(sets, values, clusters, n_boot=500, seed=0, confidence=0.95)
    assert list(table["curve"]) == ["model", "empty", "key", "key"]
    assert table["faithfulness_full"].tolist() == [1.0, 0.0, 0.5, 1.0]
    # a whole cluster holds one kept and one lost item: every resample keeps exactly half
    assert table.loc[2, "faithfulness_full_low"] == table.loc[2, "faithfulness_full_high"] == 0.5
    f = table["faithfulness_logit"]
    expected = ((values["logit"].mean(1) - values["logit"][1].mean())
                / (values["logit"][0].mean() - values["logit"][1].mean()))
    np.testing.assert_allclose(f, expected)
    assert ((table["faithfulness_logit_low"] <= f + 1e-12).all()
            and (f <= table["faithfulness_logit_high"] + 1e-12).all())
    assert table.loc[2, "faithfulness_logit_high"] - table.loc[2, "faithfulness_logit_low"] > 0.01
    # the model and the empty circuit alike: undefined, not a division by zero
    flat = protocol.faithfulness_table(sets, {"first": np.ones((4, n))}, clusters, n_boot=50, seed=0,
                                       confidence=0.95)
    assert flat["faithfulness_first"].isna().all()
    with pytest.raises(ValueError, match="exactly one 'model'"):
        protocol.faithfulness_table(sets[1:], {"full": values["full"][1:]}, clusters, n_boot=10, seed=0,
                                    confidence=0.95)


def _items(key_value, random_values, n=30):
    rows = []
    for curve, mlps, k, seed, value in [("model", "all", 24, -1, 1.0), ("empty", "none", 0, -1, 0.0),
                                        ("key", "key", 3, -1, key_value),
                                        *[("random", "key", 3, d, v) for d, v in enumerate(random_values)]]:
        for i in range(n):
            rows.append({"curve": curve, "mlps": mlps, "k": k, "seed": seed, "sample_id": i, "cluster": str(i // 3),
                         "full_correct": float(value if isinstance(value, float) else value[i]),
                         "answer_logit": 10.0 * float(value if isinstance(value, float) else value[i])})
    return pd.DataFrame(rows)


def test_key_vs_random():
    res = protocol.key_vs_random(_items(0.9, [0.2, 0.4]), column="full_correct", mlps="key", n_boot=200, seed=0,
                                 confidence=0.95)
    assert res["key"] == pytest.approx(0.9) and res["random"] == pytest.approx(0.3)
    assert res["difference"] == pytest.approx(0.6) and res["ci_low"] == pytest.approx(0.6)  # constant per item
    assert res["draws"] == 2 and res["n_items"] == 30 and res["n_clusters"] == 10
    mixed = np.r_[np.ones(15), np.zeros(15)]
    res = protocol.key_vs_random(_items(mixed, [np.zeros(30)]), column="answer_logit", mlps="key", n_boot=300,
                                 seed=0, confidence=0.95)
    assert res["difference"] == pytest.approx(0.5) and res["ci_low"] < 0.5 < res["ci_high"]
    assert protocol.key_vs_random(_items(0.9, [0.2]), column="full_correct", mlps="all", n_boot=10, seed=0,
                                  confidence=0.95) is None
    alone = protocol.key_vs_random(_items(0.9, []), column="full_correct", mlps="key", n_boot=50, seed=0,
                                   confidence=0.95)
    assert alone["key"] == pytest.approx(0.9) and alone["draws"] == 0  # no random draw: its own numbers, NaN diff
    assert np.isnan(alone["difference"]) and np.isnan(alone["ci_low"]) and np.isnan(alone["random"])


def test_pooled_values_keep_each_set_on_its_own_items_when_groups_differ_in_size():
    """Pooled over operators that score 3 and 2 pairs: set s's row is set s's values of the first operator's pairs,
    then of the second's, and the clusters follow (a reshape by operator count mixes sets once the counts differ)."""
    rows = []
    for task, n in (("addition", 3), ("division", 2)):
        for s in range(2):  # set-major, as the stages write a per-item table
            rows += [{"task": task, "cluster": f"{task}:{i}", "full_correct": 100 * s + 10 * (task == "division") + i}
                     for i in range(n)]
    items = pd.DataFrame(rows)
    values, clusters = protocol.pooled_values(items, 2, {"full": "full_correct"}, groups=["addition", "division"])
    np.testing.assert_array_equal(values["full"], [[0, 1, 2, 10, 11], [100, 101, 102, 110, 111]])
    assert clusters.tolist() == ["addition:0", "addition:1", "addition:2", "division:0", "division:1"]
    with pytest.raises(ValueError, match="'division': 3 rows are not 2 sets"):
        protocol.pooled_values(items.iloc[:-1], 2, {"full": "full_correct"}, groups=["addition", "division"])


def test_sanity_stop_stops_on_every_ablation_the_verdicts_read():
    """`circuit.discover.sanity: stop`: a failed check of either ablation stops the rule (the verdicts read both);
    `warn`: none stops, the failures are recorded and the verdicts say inconclusive."""
    assert protocol.strict_kinds("stop") == list(protocol.KINDS) == ["resample", "mean"]
    assert protocol.strict_kinds("warn") == []

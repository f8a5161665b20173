"""A claims table of the shape arithmech.report.claims writes (one row per claim and scope), with every verdict,
sub-rows, missing intervals and a claim that was not measured: what the scorecard renderers are tested on. Its
"paper" cells are made-up placeholders, not the paper's numbers (those are the claim modules' records, checked against
the paper's text in tests/report/claims/test_registry.py)."""

import numpy as np
import pandas as pd

NAN = np.nan
COLUMNS = ["claim", "scope", "stage", "statement", "paper", "measure", "value", "ci_low", "ci_high", "unit", "n",
           "split", "verdict", "rule", "note", "source"]


def example_claims() -> pd.DataFrame:
    rows = [
        ("few_key_heads", "all", "identify", "Fewer than 5% of heads are key heads.", "2.3% (24 of 1,024 heads)",
         "share of heads the rule selects, mean over operators", 2.2, NAN, NAN, "percent", 270, "identification",
         "holds", "holds if the share is below 5% for every operator", "1 head passes the paper's -5% threshold",
         "key_components/shared.png"),
        ("few_key_heads", "addition", "identify", "", "", "share of heads", 2.6, NAN, NAN, "percent", 270,
         "identification", "holds", "holds if the share is below 5% for every operator", "", "effects/addition.png"),
        ("few_key_heads", "division", "identify", "", "", "share of heads", 1.9, NAN, NAN, "percent", 270,
         "identification", "holds", "holds if the share is below 5% for every operator", "", "effects/division.png"),
        ("middle_layers", "all", "identify", "Key heads sit in the middle layers.", "layers 12-17 of 32",
         "median relative depth of the key heads (% of layers)", 71.0, 60.0, 80.0, "percent", 9,
         "identification", "partly",
         "holds if the median relative depth is within [30%, 70%]", "later than the paper's 38-53%", ""),
        ("knockout_collapse", "all", "validate", "Knocking out the key heads collapses accuracy; as many random "
         "heads do not.", "about 70% lower", "accuracy drop, key minus layer-matched random", -41.3, -55.0, -28.4,
         "points", 120, "validation", "holds",
         "holds if the interval of key minus layer-matched random excludes 0 in the paper's direction", "",
         "knockout/addition.png"),
        ("knockout_collapse", "addition | end", "validate", "", "", "accuracy drop", -52.5, -60.1, -44.0, "points", 120,
         "validation", "holds", "holds if the interval of key minus layer-matched random excludes 0 in the paper's "
         "direction", "", "knockout/addition.png"),
        ("knockout_collapse", "division | all", "validate", "", "", "accuracy drop", -3.1, -12.0, 6.0, "points", 40,
         "validation", "inconclusive", "holds if the interval of key minus layer-matched random excludes 0 in the "
         "paper's direction", "too little power: detects about 14 points with 80% power", "knockout/division.png"),
        ("key_attention", "all", "analyze", "Key heads attend from END to the operands and the operator.",
         "most attention on the operands", "effect of the strongest head on the answer logit", -0.01311, -0.015,
         -0.011, "effect", 120, "validation", "does not hold", "holds if key heads give the operands more than "
         "other heads", "", "analysis/addition_roles.png"),
        ("mlp_answer", "all", "analyze", "MLP outputs carry the answer more than the operands.",
         "answer cosine rises after the key heads", "cosine with the answer, last MLP", 0.1234, 0.1, 0.15,
         "cosine", 60, "validation", "holds", "holds if the answer's cosine exceeds each operand's", "",
         "analysis/addition_probes.png"),
        ("sft_vs_full", "all", "finetune", "Precise SFT matches or beats full fine-tuning on the math target.",
         "precise 48.1 vs full 47.6", "test exact match, precise minus full", -2.0, -9.5, 5.0, "points", 200, "test",
         "inconclusive", "holds if the interval's lower end is above -5 points",
         "too little power: detects about 9.0 points with 80% power", "finetune/study.png"),
        ("sft_off_target", "all", "finetune", "Precise SFT costs less off target than full fine-tuning.",
         "less forgetting", "KL to base, precise minus full", -0.0123, -0.02, -0.004, "nats", 1179648, "test", "holds",
         "holds if the interval excludes 0 below", "", "finetune/study.md"),
        ("sft_speed", "all", "finetune", "Precise SFT steps are faster than full fine-tuning.", "3.3x faster",
         "full step time over precise step time", 3.29, NAN, NAN, "ratio", pd.NA, "", "partly",
         "holds if the ratio is at least 2", "", "finetune/study.md"),
        ("transfer", "all", "validate", "The key heads transfer to other operators, formats and SVAMP.",
         "accuracy falls on all", "", NAN, NAN, NAN, "points", pd.NA, "", "not measured",
         "holds if key minus random excludes 0 on every target", "the transfer rule did not run (configs/paper.yaml)",
         ""),
    ]
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return frame.astype({"n": "Int64", "value": float, "ci_low": float, "ci_high": float})

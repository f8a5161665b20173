"""The teacher-forced protocol's vocabulary (docs/circuit.md), without torch: the ablation kinds, position sets and
measures its tables are keyed by (columns such as `tf_resample_correct`). The code that measures
(arithmech.interp.teacher_forcing) and the code that reads its tables (the scorecard, the findings page, make docs)
take them from here. Also the transfer's target sets, in their order: rule transfer
(arithmech.interp.ablation.transfer_targets) and make plan's cost of it read the one list.
"""

KINDS = ("resample", "mean")  # how an ablated node gets its value: another item's, or the identification mean
POSITIONS = ("tail", "end")  # ablated at END and every answer position (the protocol), or at END only
TAIL_MEASURES = ("correct", "logprob", "kl")
PRUNE_MEASURES = ("logprob", "kl")


def transfer_sets(tasks) -> list[tuple[str, str | None]]:
    """(kind, task) of each target set the transfer knocks the key heads out on, in order: every operator's pairs
    ("operator"), every number format of every operator (`data.arithmetic.FORMATS`), SVAMP and the non-math
    control (task None)."""
    from arithmech.data.arithmetic import FORMATS

    return [*(("operator", task) for task in tasks), *((fmt, task) for fmt in FORMATS for task in tasks),
            ("svamp", None), ("non_math", None)]

"""The teacher-forced protocol's vocabulary (docs/circuit.md), without torch: the ablation kinds, position sets and
measures its tables are keyed by (columns such as `tf_resample_correct`). The code that measures
(arithmech.interp.teacher_forcing) and the code that reads its tables (the scorecard, the findings page, make docs)
take them from here.
"""

KINDS = ("resample", "mean")  # how an ablated node gets its value: another item's, or the identification mean
POSITIONS = ("tail", "end")  # ablated at END and every answer position (the protocol), or at END only
TAIL_MEASURES = ("correct", "logprob", "kl")
PRUNE_MEASURES = ("logprob", "kl")

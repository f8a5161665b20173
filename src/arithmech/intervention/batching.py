"""How the model jobs batch their work, torch-free, so that `make plan` counts what the jobs do.

    SHARED_PREFIX_MIN_TOKENS   a prompt prefix all rows share runs apart only from this length on
                               (`generation.SharedPrefix`)
    COPIES_PER_FORWARD         prompt copies one forward runs at once (each with one node or node set changed):
                               the knockout's, and the transfer's and patching's where their
                               `copies_per_forward` is not set
"""

SHARED_PREFIX_MIN_TOKENS = 8  # a shorter shared prefix is not worth a separate forward
COPIES_PER_FORWARD = 256

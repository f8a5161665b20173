"""How the model jobs batch their work, torch-free, so that `make plan` counts what the jobs do.

    SHARED_PREFIX_MIN_TOKENS   a prompt prefix all rows share runs apart only from this length on
                               (`generation.SharedPrefix`)
    TRANSFER_COPIES            rows the transfer decodes at once where `transfer.copies_per_forward` is not set
"""

SHARED_PREFIX_MIN_TOKENS = 8  # a shorter shared prefix is not worth a separate forward
TRANSFER_COPIES = 256

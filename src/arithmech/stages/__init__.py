"""Rule entry points, one module per stage: `identify`, `validate`, `analyze`, `finetune` (the paper's GSM8K
recipe), `study` (the precise-SFT study) and `figures` (figures drawn from the stages' tables). Each function
reads a rule's inputs, calls the library and writes its outputs atomically with provenance; keyword-only,
so a script cannot swap two paths silently, and runnable (and tested) without Snakemake. `common` holds
what several stages share; `arithmech.jobs` sets a job up. Importing this package imports nothing else.
"""

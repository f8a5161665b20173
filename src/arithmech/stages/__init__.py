"""The rule entry points, one module per workflow/rules/*.smk: identify, validate, analyze, circuit, discover,
finetune, study, claims, findings.

Each run_* function reads a rule's inputs, calls the library and writes its outputs atomically with provenance;
keyword-only, so a script cannot swap two paths silently, and runnable (and tested) without Snakemake:

    from arithmech.stages.identify import run_build_pairs      (workflow/scripts/build_pairs.py)

No stage imports another stage, and nothing else imports a stage (tests/project/test_architecture.py).
"""

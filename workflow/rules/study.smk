# The precise-SFT study (arithmech.sft.design): the trained format measured or chosen, arithmetic items with
# disjoint operand-pair splits, every arm's lr chosen on the validation split, the chosen lr trained with more
# seeds and random-head draws, every model scored on held-out test sets and off-target sets, arm against arm
# on the same items.


# A checkpoint: with `study.train_format: auto` the trained format is known only once this job has run, and
# the jobs of the study follow from it (common.smk, study_choice); with no format inside study.base_band the
# summary says so and no study job runs.
checkpoint study_format:
    input:
        model=layout.under(layout.MODEL),
        pairs=each_task(layout.PAIRS),
    output:
        table=study_format_table("{model}"),
        choice=str(study.choice_path(study_format_table("{model}"))),
    log:
        "results/{model}/logs/study/format.log",
    benchmark:
        "results/{model}/benchmarks/study_format.tsv"
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("study_format"),
    params:
        code=library_code("study_format"),
        study=study_format_params(),
        prompts={"shot_separator": config["prompts"]["shot_separator"]},
        compute=config["compute"],
        seed=config["seed"],
        tasks=TASKS,
    script:
        "../scripts/study_format.py"


rule study_items:
    input:
        unpack(study_items_inputs),
        model=layout.under(layout.MODEL),
        pairs=each_task(layout.PAIRS),
    output:
        layout.under(layout.STUDY_ITEMS),
    log:
        "results/{model}/logs/study/items.log",
    benchmark:
        "results/{model}/benchmarks/study_items.tsv"
    localrule: CPU_JOBS_LOCAL
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        code=library_code("study_items"),
        study=study_items_params,
        prompts={"shot_separator": config["prompts"]["shot_separator"]},
        seed=config["seed"],
        tasks=TASKS,
    script:
        "../scripts/study_items.py"


rule study_train:
    input:
        unpack(study_train_inputs),
        model=layout.under(layout.MODEL),
        study_items=layout.under(layout.STUDY_ITEMS),
    output:
        directory(layout.under(layout.STUDY_RUN)),
    log:
        "results/{model}/logs/study/train/{arm}/{run}.log",
    benchmark:
        "results/{model}/benchmarks/study_train/{arm}/{run}.tsv"
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("study_train"),
    params:
        code=library_code("study_train"),
        study=study_train_params,
        compute=config["compute"],
        seed=config["seed"],
        checkpoints=lambda wc: layout.under(layout.STUDY_CHECKPOINTS, wc.model),
    script:
        "../scripts/study_train.py"


rule study_select:
    input:
        unpack(study_select_inputs),
    output:
        layout.under(layout.STUDY_SELECT),
    log:
        "results/{model}/logs/study/select/{arm}.log",
    benchmark:
        "results/{model}/benchmarks/study_select/{arm}.tsv"
    localrule: CPU_JOBS_LOCAL
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        code=library_code("study_select"),
        lr_grid=lambda wc: STUDY["lr_grid"][wc.arm],
        collapse=STUDY["collapse"],
        runs=lambda wc: study.grid_runs(wc.arm, STUDY),
    script:
        "../scripts/study_select.py"


rule study_evaluate:
    input:
        unpack(study_evaluate_inputs),
        **study_data_files(),
        model=layout.under(layout.MODEL),
        study_items=layout.under(layout.STUDY_ITEMS),
    output:
        layout.under(layout.STUDY_EVAL),
    log:
        "results/{model}/logs/study/eval/{arm}/{run}.log",
    benchmark:
        "results/{model}/benchmarks/study_evaluate/{arm}/{run}.tsv"
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("study_evaluate"),
    params:
        code=library_code("study_evaluate"),
        study=study_params("off_target"),
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/study_evaluate.py"


rule study_summary:
    input:
        unpack(study_summary_inputs),
    output:
        study=layout.under(layout.STUDY),
        comparisons=layout.under(layout.COMPARISONS),
        markdown=layout.under(layout.STUDY_MD),
        html=report(
            layout.under(layout.STUDY_HTML),
            caption="../report/study_table.rst",
            category="4. Precise SFT",
            subcategory="{model}",
            labels={"model": "{model}", "figure": "study table"},
        ),
        figure=report(
            layout.under(layout.STUDY_FIGURE),
            caption="../report/study_figure.rst",
            category="4. Precise SFT",
            subcategory="{model}",
            labels={"model": "{model}", "figure": "study: exact match and KL"},
        ),
        curves=report(
            layout.under(layout.STUDY_CURVES_FIGURE),
            caption="../report/study_curves.rst",
            category="4. Precise SFT",
            subcategory="{model}",
            labels={"model": "{model}", "figure": "study: learning curves"},
        ),
    log:
        "results/{model}/logs/study/summary.log",
    benchmark:
        "results/{model}/benchmarks/study_summary.tsv"
    localrule: CPU_JOBS_LOCAL
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        code=library_code("study_summary"),
        study=study_params(
            "confidence",
            "bootstrap",
            "base_band",
            "arms",
            "splits",
            "n_shots",
            "collapse",
        ),
        operands=config["prompts"]["operands"],  # where the heads were found (study.md says)
        runs=study_summary_runs,
        seed=config["seed"],
    script:
        "../scripts/study_summary.py"

"""Fine-tuning: precise SFT of the key heads and its controls, and scoring the fine-tuned models (stage 4).

methods.parse_method and TrainConfig say what a run trains and how (torch-free, read by the config checks too).
training.prepare and train run the fine-tuning loop; deltas.HeadDeltas are the per-head trained parameters.
checkpoints.save_checkpoint and load_checkpoint make a run resumable.
runs.train_and_save trains and saves one run; runs.load_finetuned loads what a run trained.
distributed.run_on_gpus trains a job over several processes, one per GPU (data parallel; FSDP2 for full fine-tuning).
scoring.evaluate_generation, evaluate_choice, perplexity and score_targets score a model on data sets.
design holds the precise-SFT study's formats, items, arms, lr choice and comparisons (torch-free).

Import from the modules (no re-exports here), so that importing the package imports no torch.
"""

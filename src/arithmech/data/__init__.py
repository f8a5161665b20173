"""The data: arithmetic prompt pairs, evaluation and fine-tuning sets, the prompt format, reading answers.

arithmetic.build_prompts makes reference/counterfactual prompt pairs, split_pairs picks a split, encode
left-pads a batch; format_prompts makes multi-digit and decimal prompts.
datasets.load_gsm8k, load_svamp, load_mmlu, ... load a data set as a DataFrame; fetch_hub fetches one from the Hub.
eval_sets.REGISTRY is the one registry of evaluation sets (kind, loader, config keys, Hub layout).
formatting.qa_prompt and math_prompts write the one Question/Answer prompt format, plain or chat.
answers.answer_correct, extract_answer and qa_correct read a model's answer against the gold one; answer_sentence
writes the sentence a math solution ends with.

Import from the modules (no re-exports here), so that importing the package imports no torch.
"""

"""Running the model with its internals read or replaced: hooks, mean outputs, KV caches, decoding, answers.

hooks.hooks attaches hooks to the model's real modules and always removes them; capture reads head and MLP
outputs, patch_end and patch_tail overwrite them.
means.AlignedMean and GroupedMean hold mean node outputs by position from END, what mean ablation puts in.
kvcache.prefix_cache runs a shared prefix once; repeated_cache, end_copies and PrefixCopies copy it for many rows.
decoding.greedy_decode is the one greedy decoder; decoding.Hooks the one hook convention, hooks(rows) -> context.
generation.first_token_predictions, greedy_generate and generate_texts give the model's answers, optionally
with hooks or from a SharedPrefix; check_answers scores arithmetic answers both ways.

Import from the modules (no re-exports here), so that importing the package imports no torch.
"""

"""Interpretation: which heads and MLPs carry the operator, and how (the paper's stages 1 to 3 and the circuit).

patching.collect, direct_logits and total_logits patch every node at END; effects_frame tabulates the logits.
effects.aggregate and key_components turn per-sample patching into per-node effects and the key components.
nodes.ranked_heads, random_heads and layer_matched_heads give the head sets compared (Head is (layer, head));
nodes.all_nodes, CircuitSet and kept_masks the circuits' node sets.
ablation.mean_ablate and knockout mean-ablate heads and MLPs; set_answers scores many head sets at once.
analysis.token_roles, attention_rows and mlp_probes explain the key heads' attention and the MLPs.
teacher_forcing is the circuits' one protocol: TailTrials scores circuits teacher-forced on the prompt, gold answer
and terminator, every node outside them ablated at END and every answer position with position-matched values
(resample or mean); node_ranking (|integrated gradients|) and prune find the smallest circuit that keeps a target
share of a measure (greedy node pruning on the trials); teacher_forced_table scores circuit sets with the sanity
checks. protocol is its torch-free half (the ablation kinds, the measures, faithfulness_table, key_vs_random),
which the report reads. edges.path_cuts cuts head -> MLP edges, edges.eap_ig_edges scores them.

Import from the modules (no re-exports here), so that importing the package imports no torch.
"""

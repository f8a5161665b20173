"""The model: where it comes from, how it is loaded, and the adapter that names the modules hooks attach to.

loading.prepare_model turns a source (Hub id, local HF directory or .gguf, a packaged file) into a local HF directory.
loading.load_model loads that directory as a LoadedModel, the adapter naming layers, heads, MLPs, norm, unembedding.
loading.load_stage_model, stage_meta and model_record load and describe the model as a stage's job does.
hub holds the model cache directory (run.model_cache), whether it can take a download, and the Hub's refusals
(token, licence) as messages; no torch.
tiny.build_tiny_model writes the tiny offline Llama that the tests and the smoke configuration run.

Import from the modules (no re-exports here), so that importing the package imports no torch.
"""

"""mxq inside other frameworks: ``mxq.integrations.transformers`` (Hugging Face transformers)."""

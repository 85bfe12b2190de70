"""Where models come from (above gguf).

In: a model reference (`example:NAME`, a Hugging Face repo, an Ollama name). Out: the file or URL it
names, the bundled examples, and candidate lists for `choose`.
"""

"""Generation: Generate (retrieve, prompt, stream), prompt assembly, the OpenAI-compatible backend client and
routing, the embedded llama.cpp server."""
